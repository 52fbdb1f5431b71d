//! `loadcheck`: the invariant run of issue 9 (work in progress).

fn main() {
    eprintln!("loadcheck: not built yet");
    std::process::exit(2);
}
