// mimalloc instead of glibc's allocator: a paid post makes about 700
// allocations, and with mimalloc the server ran 5 to 10 % fewer
// instructions per request (`tests/bench/callgrind.py`), 3 to 10 % less
// CPU per request in alternating external benches, and 1.4 to 1.8 times
// the large cash health checks per second at about the same peak memory
// (docs/benchmarks-history.md, "mimalloc, measured by instructions").
// With `heap_huge_pages = false`, `serve` moves it to an arena of small
// pages (`marketplace::heap`).
#[global_allocator]
static GLOBAL: marketplace::heap::Heap = marketplace::heap::Heap;

fn main() -> std::process::ExitCode {
    marketplace::cli::main()
}
