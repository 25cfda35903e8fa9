//! The batch script of a node's job, and the checks of its resources.

use std::path::Path;

use super::device_for;
use super::ticket::{safe_name, slurm_dir};
use crate::dag::Dag;
use crate::spec::SlurmResources;

pub(super) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The batch script of one node: `#SBATCH` lines from its resources, its setup
/// lines, then `exec orchestrate exec-node`.
pub fn job_script(exe: &Path, ws: &Path, node: &str, key: &str, res: &SlurmResources, cwd: &Path) -> String {
    let mut s = String::from("#!/bin/bash\n");
    s.push_str(&format!("#SBATCH --job-name=orchestrate:{}\n", safe_name(node)));
    // sbatch reads double quotes in #SBATCH lines, so paths may hold spaces
    // (submit_or_adopt refuses paths with a double quote or a newline).
    s.push_str(&format!(
        "#SBATCH --output=\"{}\"\n",
        slurm_dir(ws, "logs").join(format!("{}-%j.out", safe_name(node))).display()
    ));
    s.push_str(&format!("#SBATCH --chdir=\"{}\"\n", cwd.display()));
    if let Some(p) = &res.partition {
        s.push_str(&format!("#SBATCH --partition={p}\n"));
    }
    if let Some(a) = &res.account {
        s.push_str(&format!("#SBATCH --account={a}\n"));
    }
    if let Some(t) = &res.time {
        s.push_str(&format!("#SBATCH --time={t}\n"));
    }
    if let Some(g) = res.gpus.filter(|g| *g > 0) {
        s.push_str(&format!("#SBATCH --gpus-per-node={g}\n"));
    }
    if let Some(c) = res.cpus {
        s.push_str(&format!("#SBATCH --cpus-per-task={c}\n"));
    }
    if let Some(m) = &res.mem {
        s.push_str(&format!("#SBATCH --mem={m}\n"));
    }
    for line in &res.sbatch {
        let line = line.trim();
        let opt = line.strip_prefix("#SBATCH").map(str::trim).unwrap_or(line);
        s.push_str(&format!("#SBATCH {opt}\n"));
    }
    s.push_str(&format!("# node {node}, key {key}\nset -e\n"));
    for line in &res.setup {
        s.push_str(line);
        s.push('\n');
    }
    s.push_str(&format!("export ORCHESTRATE_DEVICE={}\n", device_for(res)));
    s.push_str(&format!(
        "exec {} exec-node {} {key}\n",
        shell_quote(&exe.display().to_string()),
        shell_quote(&ws.display().to_string())
    ));
    s
}

/// Checks resources before anything is submitted: sbatch lines must be options.
pub fn check_resources(dag: &Dag) -> Result<(), super::SlurmError> {
    for node in &dag.nodes {
        let bad = |problem: String| super::SlurmError::Resources { node: node.id().to_string(), problem };
        for line in &node.def.resources.sbatch {
            let opt = line.trim().strip_prefix("#SBATCH").map(str::trim).unwrap_or(line.trim());
            if !opt.starts_with('-') || opt.contains('\n') {
                return Err(bad(format!("sbatch line '{line}' is not an sbatch option (expected e.g. --qos=high)")));
            }
        }
        for (field, v) in [
            ("partition", &node.def.resources.partition),
            ("account", &node.def.resources.account),
            ("time", &node.def.resources.time),
            ("mem", &node.def.resources.mem),
        ] {
            if let Some(v) = v {
                if v.trim().is_empty() || v.contains(char::is_whitespace) {
                    return Err(bad(format!("resources.{field} '{v}' must be one word")));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SlurmResources;
    use std::path::Path;

    #[test]
    fn script_carries_resources_and_quotes_paths() {
        let res = SlurmResources {
            partition: Some("gpu".into()),
            account: Some("lab".into()),
            time: Some("4:00:00".into()),
            gpus: Some(2),
            cpus: Some(8),
            mem: Some("64G".into()),
            sbatch: vec!["--qos=high".into(), "#SBATCH --constraint=h100".into()],
            setup: vec!["module load cuda".into()],
            retries: None,
        };
        let s = job_script(
            Path::new("/opt/o r/orchestrate"),
            Path::new("/shared/ws"),
            "grpo@seed=1",
            "abc",
            &res,
            Path::new("/home/x"),
        );
        for line in [
            "#SBATCH --partition=gpu",
            "#SBATCH --account=lab",
            "#SBATCH --time=4:00:00",
            "#SBATCH --gpus-per-node=2",
            "#SBATCH --cpus-per-task=8",
            "#SBATCH --mem=64G",
            "#SBATCH --qos=high",
            "#SBATCH --constraint=h100",
            "#SBATCH --output=\"/shared/ws/slurm/logs/grpo_seed_1-%j.out\"",
            "#SBATCH --chdir=\"/home/x\"",
            "module load cuda",
            "export ORCHESTRATE_DEVICE=cuda",
            "exec '/opt/o r/orchestrate' exec-node '/shared/ws' abc",
        ] {
            assert!(s.lines().any(|l| l == line), "missing line {line:?} in\n{s}");
        }
        // Every #SBATCH line comes before the first command, or sbatch ignores it.
        let first_cmd = s.lines().position(|l| !l.starts_with('#')).unwrap();
        assert!(s.lines().skip(first_cmd).all(|l| !l.starts_with("#SBATCH")), "{s}");
    }

    #[test]
    fn cpu_jobs_are_keyed_and_run_on_cpu() {
        let s = job_script(Path::new("/o"), Path::new("/w"), "n", "k", &SlurmResources::default(), Path::new("/"));
        assert!(s.contains("export ORCHESTRATE_DEVICE=cpu\n"));
        assert!(!s.contains("--gpus"));
    }

    #[test]
    fn node_resources_override_spec_defaults_and_add_lines() {
        let base = SlurmResources {
            partition: Some("cpu".into()),
            time: Some("1:00:00".into()),
            sbatch: vec!["--qos=low".into()],
            ..Default::default()
        };
        let own = SlurmResources {
            partition: Some("gpu".into()),
            gpus: Some(1),
            sbatch: vec!["--exclusive".into()],
            ..Default::default()
        };
        let r = own.over(&base);
        assert_eq!(r.partition.as_deref(), Some("gpu"));
        assert_eq!(r.time.as_deref(), Some("1:00:00"));
        assert_eq!(r.gpus, Some(1));
        assert_eq!(r.sbatch, vec!["--qos=low".to_string(), "--exclusive".to_string()]);
        assert_eq!(r.retries, None);
        let r = SlurmResources { retries: Some(2), ..Default::default() }.over(&base);
        assert_eq!(r.retries, Some(2));
    }
}
