//! Test support of the device-worker integration tests.
#![allow(dead_code)]

pub mod parity;
pub mod prefill;
pub mod qwen35;
pub mod vision;
