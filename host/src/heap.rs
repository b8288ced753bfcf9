//! The process's heap: mimalloc, and where its memory comes from.
//!
//! mimalloc asks the kernel for transparent huge pages (2 MiB) for the
//! memory it hands out. Where fresh memory is dear, as on the VMs this
//! service is measured on (their free memory is handed back to the
//! hypervisor, so the first touch of a page makes the hypervisor back it),
//! the first touch of a huge page stops the thread for about 12 ms while
//! 2 MiB are backed and zeroed; a thread holding the commit batch's lease
//! then holds every paid request up with it, and while the database grows
//! (its page cache is on this heap) that happened about a dozen times a
//! second under paid load. Where fresh memory is cheap, huge pages cost
//! nothing of the kind and save CPU, so they stay the default; with
//! `heap_huge_pages = false`, [`use_small_pages`] puts every allocation from
//! then on in an arena of 4 KiB pages (one arena of reserved address
//! space, touched page by page as it is used): a first touch then costs one
//! page's backing, spread over the requests instead of gathered into a
//! stall (`heap_huge_pages`, README "Configuration"; figures in
//! docs/benchmarks-history.md, "Huge pages and the paid tail").
//!
//! [`Heap`] is the global allocator of the `marketplace` binary. Until
//! [`use_small_pages`] is called, and whenever the arena cannot give a
//! block (it is full), a block comes from mimalloc's own heap; either kind
//! is freed by `mi_free`, from any thread.

use libmimalloc_sys as mi;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The heap allocations go to: null until [`use_small_pages`], then a
/// mimalloc heap that allocates only in the small-page arena (a mimalloc
/// heap serves any thread: each has its own part of it).
static SMALL: AtomicPtr<mi::mi_heap_t> = AtomicPtr::new(std::ptr::null_mut());

/// mimalloc, through the small-page arena once it is set up.
pub struct Heap;

// SAFETY: every block comes from mimalloc with the layout's size and
// alignment, and `mi_free`/`mi_realloc_aligned` take a block of any of
// its heaps; a null from the arena falls back to mimalloc's own heap,
// which returns null only when the process is out of memory.
unsafe impl GlobalAlloc for Heap {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let heap = SMALL.load(Ordering::Relaxed);
        if !heap.is_null() {
            // SAFETY: `heap` lives as long as the process.
            let p = unsafe { mi::mi_heap_malloc_aligned(heap, layout.size(), layout.align()) };
            if !p.is_null() {
                return p.cast();
            }
        }
        // SAFETY: plain mimalloc allocation.
        unsafe { mi::mi_malloc_aligned(layout.size(), layout.align()).cast() }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let heap = SMALL.load(Ordering::Relaxed);
        if !heap.is_null() {
            // SAFETY: as in `alloc`.
            let p = unsafe { mi::mi_heap_zalloc_aligned(heap, layout.size(), layout.align()) };
            if !p.is_null() {
                return p.cast();
            }
        }
        // SAFETY: plain mimalloc allocation.
        unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()).cast() }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from one of mimalloc's heaps.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let heap = SMALL.load(Ordering::Relaxed);
        if !heap.is_null() {
            // SAFETY: `ptr` came from one of mimalloc's heaps; on null it
            // is left as it was.
            let p = unsafe {
                mi::mi_heap_realloc_aligned(heap, ptr.cast::<c_void>(), new_size, layout.align())
            };
            if !p.is_null() {
                return p.cast();
            }
        }
        // SAFETY: as above.
        unsafe { mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast() }
    }
}

/// How much address space the arena reserves: the machine's memory, at
/// most 4 GiB (a reservation larger than the memory is refused where the
/// kernel checks overcommit). Past it blocks come from mimalloc's heap.
fn arena_bytes() -> usize {
    // SAFETY: sysconf only reads.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let physical = usize::try_from(pages.max(0))
        .unwrap_or(0)
        .saturating_mul(usize::try_from(page.max(0)).unwrap_or(0));
    physical.clamp(64 << 20, 4 << 30)
}

/// Reserve an arena of `bytes` without huge pages and make it where
/// [`Heap`] allocates. The arena's size, or the error mimalloc gave (then
/// allocations stay in mimalloc's heap). Called once, at the start of
/// `serve`; a second call keeps the first arena.
pub fn use_small_pages() -> Result<usize, i32> {
    use_small_pages_of(arena_bytes())
}

fn use_small_pages_of(bytes: usize) -> Result<usize, i32> {
    static ARENA: std::sync::OnceLock<Result<usize, i32>> = std::sync::OnceLock::new();
    *ARENA.get_or_init(|| {
        let mut id: mi::mi_arena_id_t = std::ptr::null_mut();
        // Committed (read-write at once: this is Linux's overcommit, no
        // memory is used until touched), no large pages, exclusive (only
        // the heap made for it allocates there).
        // SAFETY: `id` is a valid place for the arena's id.
        let err = unsafe { mi::mi_reserve_os_memory_ex(bytes, true, false, true, &mut id) };
        if err != 0 {
            return Err(err);
        }
        // SAFETY: `id` names the arena just reserved.
        let heap = unsafe { mi::mi_heap_new_in_arena(id) };
        if heap.is_null() {
            return Err(libc::ENOMEM);
        }
        SMALL.store(heap, Ordering::Relaxed);
        Ok(bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" {
        // mimalloc 3's (the bindings name only version 2's).
        fn mi_heap_contains(heap: *const mi::mi_heap_t, p: *const c_void) -> bool;
    }

    /// The heap the allocator is using, once set up (64 MiB of arena, so
    /// that a test can fill it).
    fn small_heap() -> *mut mi::mi_heap_t {
        use_small_pages_of(64 << 20).expect("an arena of 64 MiB");
        SMALL.load(Ordering::Relaxed)
    }

    /// One test: a test filling the arena while another checks where its
    /// blocks come from would race it.
    #[test]
    fn blocks_come_from_the_arena_and_then_from_mimallocs_heap() {
        let heap = small_heap();
        blocks_come_from_the_arena_keep_their_contents_and_alignment(heap);
        a_full_arena_leaves_allocations_to_mimallocs_heap(heap);
    }

    fn blocks_come_from_the_arena_keep_their_contents_and_alignment(heap: *mut mi::mi_heap_t) {
        for (size, align) in [(1, 1), (24, 8), (4096, 4096), (100_000, 64), (3 << 20, 16)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            unsafe {
                let p = Heap.alloc(layout);
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "alignment {align}");
                assert!(
                    mi_heap_contains(heap, p.cast()),
                    "{size} bytes in the arena"
                );
                std::ptr::write_bytes(p, 0xA5, size);
                let q = Heap.realloc(p, layout, size * 2 + 7);
                assert_eq!(q as usize % align, 0);
                assert!(
                    std::slice::from_raw_parts(q, size)
                        .iter()
                        .all(|&b| b == 0xA5)
                );
                Heap.dealloc(q, Layout::from_size_align(size * 2 + 7, align).unwrap());
                let z = Heap.alloc_zeroed(layout);
                assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                Heap.dealloc(z, layout);
            }
        }
    }

    fn a_full_arena_leaves_allocations_to_mimallocs_heap(heap: *mut mi::mi_heap_t) {
        let layout = Layout::from_size_align(1 << 20, 8).unwrap();
        // 96 MiB of live blocks from a 64 MiB arena: all given, some
        // from elsewhere, and every one usable and freed.
        let blocks: Vec<*mut u8> = (0..96)
            .map(|i| unsafe {
                let p = Heap.alloc(layout);
                assert!(!p.is_null(), "block {i}");
                p.write(i as u8);
                p
            })
            .collect();
        let inside = blocks
            .iter()
            .filter(|&&p| unsafe { mi_heap_contains(heap, p.cast()) })
            .count();
        assert!(inside > 0 && inside < 96, "{inside} of 96 in the arena");
        for (i, p) in blocks.into_iter().enumerate() {
            unsafe {
                assert_eq!(p.read(), i as u8);
                Heap.dealloc(p, layout);
            }
        }
    }
}
