//! Training artifacts readable without libtorch: resumable state files and
//! their comparison (`check.resume`). The training loops themselves run in the
//! worker (`src/torch/train/`).

pub mod state;
