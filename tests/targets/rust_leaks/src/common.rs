#![allow(dead_code)]
//! The leaks every binary makes, and the harness's command loop (tests/targets/harness.h's
//! protocol: "ready PID", then one "done" per command). `Counting` wraps a global allocator to
//! know, byte for byte, what each leak holds: memhook must report the same.
use std::alloc::{GlobalAlloc, Layout};
use std::collections::HashMap;
use std::hint::black_box;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

static OUTSTANDING: AtomicI64 = AtomicI64::new(0);
static COUNTED: AtomicBool = AtomicBool::new(false); // a Counting allocator is the global one

pub struct Counting<A>(pub A);

fn count(bytes: i64) {
    COUNTED.store(true, Ordering::Relaxed);
    OUTSTANDING.fetch_add(bytes, Ordering::Relaxed);
}

unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = self.0.alloc(l);
        if !p.is_null() { count(l.size() as i64); }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = self.0.alloc_zeroed(l);
        if !p.is_null() { count(l.size() as i64); }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        count(-(l.size() as i64));
        self.0.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let q = self.0.realloc(p, l, n);
        if !q.is_null() { count(n as i64 - l.size() as i64); }
        q
    }
}

/// Bytes `f` left allocated: by the counter where there is one, else `known`.
fn held(f: impl FnOnce() -> usize) -> String {
    let before = OUTSTANDING.load(Ordering::Relaxed);
    let known = f();
    let after = OUTSTANDING.load(Ordering::Relaxed);
    if COUNTED.load(Ordering::Relaxed) { (after - before).to_string() } else if known > 0 { known.to_string() } else { "?".into() }
}

#[inline(never)]
pub fn leak_vec() -> usize {
    let v: Vec<u8> = black_box(Vec::with_capacity(1000));
    std::mem::forget(v);
    1000
}

#[inline(never)]
pub fn leak_box() -> usize {
    std::mem::forget(black_box(Box::new([7u64; 16])));
    128
}

#[inline(never)]
pub fn leak_string() -> usize {
    let mut s = String::with_capacity(300);
    s.push_str("a string that leaks");
    std::mem::forget(black_box(s));
    300
}

#[inline(never)]
pub fn leak_pushes() -> usize {
    let mut v: Vec<u32> = Vec::new();
    for i in 0..100 { v.push(black_box(i)); }
    let bytes = v.capacity() * 4;
    std::mem::forget(v);
    bytes
}

#[inline(never)]
pub fn leak_map() -> usize {
    let mut m: HashMap<u64, u64> = HashMap::new();
    for i in 0..100 { m.insert(black_box(i), i); }
    std::mem::forget(m);
    0 // (hashbrown's layout is its own: only a Counting program knows)
}

#[inline(never)]
pub fn churn() {
    for i in 0..100 { drop(black_box(vec![i as u8; 555])); }
}

pub fn serve() {
    println!("ready {}", std::process::id());
    for line in std::io::stdin().lock().lines() {
        let cmd = line.unwrap_or_default();
        match cmd.trim() {
            "exit" => break,
            "leak" => {
                let vec = held(leak_vec);
                let bx = held(leak_box);
                let string = held(leak_string);
                let pushes = held(leak_pushes);
                let map = held(leak_map);
                println!("leaked leak_vec={vec} leak_box={bx} leak_string={string} \
                          leak_pushes={pushes} leak_map={map}");
            }
            "churn" => churn(),
            _ => {}
        }
        println!("done");
    }
}
