//! `loadcheck`: the invariant run of issue 9 (being written).

mod stack;
mod verify;
#[allow(unused_imports)]
use verify::{verify, Scope};

fn main() {
    eprintln!("loadcheck: not built yet");
    std::process::exit(2);
}
