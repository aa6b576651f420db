//! tikv-jemallocator (jemalloc linked in, its names _rjem_-prefixed), counted.
#[path = "../common.rs"]
mod common;

#[global_allocator]
static GLOBAL: common::Counting<tikv_jemallocator::Jemalloc> =
    common::Counting(tikv_jemallocator::Jemalloc);

fn main() { common::serve() }
