//! The System allocator (glibc's malloc), counted.
#[path = "../common.rs"]
mod common;

#[global_allocator]
static GLOBAL: common::Counting<std::alloc::System> = common::Counting(std::alloc::System);

fn main() { common::serve() }
