//! `loadcheck`: the invariant run of issue 9 (being written).

mod stack;
mod verify;

fn main() {
    eprintln!("loadcheck: not built yet");
    std::process::exit(2);
}
