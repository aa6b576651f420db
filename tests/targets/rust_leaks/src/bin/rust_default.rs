//! No #[global_allocator]: Rust's default (std's __rdl_alloc, glibc's malloc), not counted.
#[path = "../common.rs"]
mod common;

fn main() { common::serve() }
