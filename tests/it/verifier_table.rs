//! The strict StockArithmetic verifier on a table of responses: every rejection
//! reason, and the forms that are accepted.

use orchestrate_core::data::verifier::{FinishReason, Reason, Response, StockArithmetic, Verifier};
use serde_json::json;

/// 5 + 3 + 2 - 3 - 1 = 6.
fn problem() -> serde_json::Value {
    json!({"initial": 5, "deliveries": [3, 2], "withdrawals": [3, 1]})
}

enum Expect {
    Correct,
    Zero(Reason),
}
use Expect::*;

fn check(text: &str, finish: FinishReason, decodable: bool, expect: Expect) {
    let v = StockArithmetic
        .verify(&problem(), &Response { text, finish, tokenization_valid: decodable })
        .expect("the problem is valid");
    assert_eq!(v.expected, json!(6));
    match expect {
        Correct => {
            assert_eq!((v.reward, v.valid, v.reason), (1, true, None), "{text:?}");
            assert_eq!(v.value, Some(json!(6)));
        }
        Zero(reason) => {
            assert_eq!(v.reward, 0, "{text:?} should score 0");
            assert_eq!(v.reason, Some(reason), "{text:?}");
            assert_eq!(v.valid, reason == Reason::WrongAnswer, "{text:?}");
        }
    }
}

const E: FinishReason = FinishReason::Eos;

#[test]
fn the_verifier_table() {
    let oversized = format!("{}{}", " ".repeat(239), r#"{"final_stock": 6}"#);
    assert_eq!(oversized.chars().count(), 257);
    let object = r#"{"final_stock": 6}"#;
    let at_limit = format!("{}{object}", " ".repeat(256 - object.len()));
    assert_eq!(at_limit.chars().count(), 256);
    let deep = format!("{{\"final_stock\": {}6{}}}", "[".repeat(70), "]".repeat(70));
    let cases: Vec<(&str, FinishReason, bool, Expect)> = vec![
        // Accepted forms.
        (r#"{"final_stock": 6}"#, E, true, Correct),
        (r#"{"final_stock":6}"#, E, true, Correct),
        ("  {\"final_stock\": 6}  ", E, true, Correct),
        ("\n{\"final_stock\": 6}\n", E, true, Correct),
        ("\t{ \"final_stock\" :\t6 }\r\n", E, true, Correct),
        (r#"{"final_\u0073tock": 6}"#, E, true, Correct),
        (at_limit.as_str(), E, true, Correct),
        // Well-formed but wrong.
        (r#"{"final_stock": 7}"#, E, true, Zero(Reason::WrongAnswer)),
        (r#"{"final_stock": 0}"#, E, true, Zero(Reason::WrongAnswer)),
        (r#"{"final_stock": 300}"#, E, true, Zero(Reason::WrongAnswer)),
        (r#"{"final_stock": -0}"#, E, true, Zero(Reason::WrongAnswer)),
        // No EOS, even when the start is correct JSON.
        (r#"{"final_stock": 6}"#, FinishReason::Length, true, Zero(Reason::CompletionWithoutEos)),
        (r#"{"final_stock": 6"#, FinishReason::Length, true, Zero(Reason::CompletionWithoutEos)),
        // Undecodable token.
        (r#"{"final_stock": 6}"#, E, false, Zero(Reason::UndecodableToken)),
        // Oversized.
        (oversized.as_str(), E, true, Zero(Reason::Oversized)),
        // Markdown fences.
        ("```json\n{\"final_stock\": 6}\n```", E, true, Zero(Reason::MarkdownFence)),
        ("```{\"final_stock\": 6}```", E, true, Zero(Reason::MarkdownFence)),
        // Not JSON.
        ("", E, true, Zero(Reason::NotJson)),
        ("final_stock: 6", E, true, Zero(Reason::NotJson)),
        ("{'final_stock': 6}", E, true, Zero(Reason::NotJson)),
        ("{final_stock: 6}", E, true, Zero(Reason::NotJson)),
        (r#"{"final_stock": 6,}"#, E, true, Zero(Reason::NotJson)),
        (r#"{"final_stock": +6}"#, E, true, Zero(Reason::NotJson)),
        (r#"{"final_stock": 06}"#, E, true, Zero(Reason::NotJson)),
        (r#"{"final_stock": 0x6}"#, E, true, Zero(Reason::NotJson)),
        ("The answer is 6.", E, true, Zero(Reason::NotJson)),
        (deep.as_str(), E, true, Zero(Reason::NotJson)),
        // Non-finite numbers.
        (r#"{"final_stock": NaN}"#, E, true, Zero(Reason::NonFiniteNumber)),
        (r#"{"final_stock": Infinity}"#, E, true, Zero(Reason::NonFiniteNumber)),
        (r#"{"final_stock": -Infinity}"#, E, true, Zero(Reason::NonFiniteNumber)),
        // Duplicate key, extra key, missing key.
        (r#"{"final_stock": 6, "final_stock": 6}"#, E, true, Zero(Reason::DuplicateKey)),
        (r#"{"final_stock": 6, "unit": "boxes"}"#, E, true, Zero(Reason::ExtraKey)),
        (r#"{"stock": 6}"#, E, true, Zero(Reason::ExtraKey)),
        (r#"{"Final_Stock": 6}"#, E, true, Zero(Reason::ExtraKey)),
        ("{}", E, true, Zero(Reason::MissingKey)),
        // Not an object.
        ("6", E, true, Zero(Reason::NotAnObject)),
        (r#"[{"final_stock": 6}]"#, E, true, Zero(Reason::NotAnObject)),
        (r#""{\"final_stock\": 6}""#, E, true, Zero(Reason::NotAnObject)),
        // Value types.
        (r#"{"final_stock": {"value": 6}}"#, E, true, Zero(Reason::NestedValue)),
        (r#"{"final_stock": [6]}"#, E, true, Zero(Reason::NestedValue)),
        (r#"{"final_stock": true}"#, E, true, Zero(Reason::BoolValue)),
        (r#"{"final_stock": 6.0}"#, E, true, Zero(Reason::FloatValue)),
        (r#"{"final_stock": 6e0}"#, E, true, Zero(Reason::FloatValue)),
        (r#"{"final_stock": 0.6e1}"#, E, true, Zero(Reason::FloatValue)),
        (r#"{"final_stock": "6"}"#, E, true, Zero(Reason::StringValue)),
        (r#"{"final_stock": null}"#, E, true, Zero(Reason::NullValue)),
        // Range.
        (r#"{"final_stock": -6}"#, E, true, Zero(Reason::NegativeValue)),
        (r#"{"final_stock": 301}"#, E, true, Zero(Reason::OutOfRange)),
        (r#"{"final_stock": 99999999999999999999999999999999999999999}"#, E, true, Zero(Reason::OutOfRange)),
        // Two objects, trailing text.
        (r#"{"final_stock": 6}{"final_stock": 6}"#, E, true, Zero(Reason::MultipleValues)),
        ("{\"final_stock\": 6}\n{\"final_stock\": 6}", E, true, Zero(Reason::MultipleValues)),
        (r#"{"final_stock": 6} Done."#, E, true, Zero(Reason::TrailingText)),
        (r#"Answer: {"final_stock": 6}"#, E, true, Zero(Reason::NotJson)),
    ];
    assert!(cases.len() >= 40);
    for (text, finish, decodable, expect) in cases {
        check(text, finish, decodable, expect);
    }
}

#[test]
fn an_invalid_problem_is_the_callers_error_not_a_zero() {
    let bad = json!({"initial": 1, "deliveries": [0, 0], "withdrawals": [5, 0]});
    let r = Response { text: "{\"final_stock\": 0}", finish: E, tokenization_valid: true };
    assert!(StockArithmetic.verify(&bad, &r).is_err());
    let extra = json!({"initial": 1, "deliveries": [0, 0], "withdrawals": [0, 0], "hint": 1});
    assert!(StockArithmetic.verify(&extra, &r).is_err());
}
