//! The process's heap: mimalloc, and where its memory comes from.
//!
//! mimalloc asks the kernel for transparent huge pages (2 MiB) for the
//! memory it hands out. Where fresh memory is dear, as on the VMs this
//! service is measured on (their free memory is handed back to the
//! hypervisor, so the first touch of a page makes the hypervisor back it),
//! the first touch of a huge page stops the thread for about 12 ms while
//! 2 MiB are backed and zeroed; a thread holding the commit batch's lease
//! then holds every paid request up with it, and while the database grows
//! (redb keeps its pages on this heap) that happened about a dozen times a
//! second under paid load. Where fresh memory is cheap, huge pages cost
//! nothing of the kind and save CPU, so they stay the default; with
//! `heap_huge_pages = false`, [`use_small_pages`] puts the allocations from
//! then on in an arena of 4 KiB pages (address space mapped once and
//! marked `MADV_NOHUGEPAGE`, so even where the kernel gives huge pages to
//! every mapping; touched page by page as it is used): a first touch then
//! costs one page's backing, spread over the requests instead of gathered
//! into a stall (`heap_huge_pages`, README "Configuration"; figures in
//! docs/benchmarks-history.md, "Huge pages and the paid tail").
//!
//! [`Heap`] is the global allocator of the `marketplace` binary. Until
//! [`use_small_pages`] is called, for alignments above 64 KiB (which an
//! arena of mimalloc's own choosing must serve), and once the arena has
//! been full (a full arena makes each allocation that misses mimalloc's
//! fast path collect and purge before it fails, so the first failure
//! sends every later block to mimalloc's heap), a block comes from
//! mimalloc's own heap; either kind is freed by `mi_free`, from any
//! thread.

use libmimalloc_sys as mi;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// The heap allocations go to: null until [`use_small_pages`], then a
/// mimalloc heap that allocates only in the small-page arena (a mimalloc
/// heap serves any thread: each has its own part of it).
static SMALL: AtomicPtr<mi::mi_heap_t> = AtomicPtr::new(std::ptr::null_mut());

/// The arena refused a block once: it is full, and every later block
/// comes from mimalloc's heap.
static FULL: AtomicBool = AtomicBool::new(false);

/// The largest alignment the arena's heap can give (mimalloc's slice).
const ARENA_ALIGN: usize = 64 << 10;

/// The small-page heap, when a block of `align` should come from it.
#[inline]
fn small(align: usize) -> Option<*mut mi::mi_heap_t> {
    let heap = SMALL.load(Ordering::Acquire);
    (!heap.is_null() && align <= ARENA_ALIGN && !FULL.load(Ordering::Relaxed)).then_some(heap)
}

/// A block from the small-page heap, or null (and the arena taken for
/// full) when it had none.
#[inline]
fn from_arena(p: *mut c_void) -> Option<*mut u8> {
    if p.is_null() {
        FULL.store(true, Ordering::Relaxed);
        None
    } else {
        Some(p.cast())
    }
}

/// mimalloc, through the small-page arena once it is set up.
pub struct Heap;

/// A block of `layout` from the small-page heap through `in_heap`, else
/// from mimalloc's heap through `plain`.
///
/// # Safety
/// `in_heap` and `plain` are mimalloc's aligned allocation functions.
#[inline]
unsafe fn allocate(
    layout: Layout,
    in_heap: unsafe extern "C" fn(*mut mi::mi_heap_t, usize, usize) -> *mut c_void,
    plain: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    if let Some(heap) = small(layout.align()) {
        // SAFETY: `heap` lives as long as the process.
        if let Some(p) = from_arena(unsafe { in_heap(heap, layout.size(), layout.align()) }) {
            return p;
        }
    }
    // SAFETY: plain mimalloc allocation.
    unsafe { plain(layout.size(), layout.align()).cast() }
}

// SAFETY: every block comes from mimalloc with the layout's size and
// alignment, and `mi_free`/`mi_realloc_aligned` take a block of any of
// its heaps; a null from the arena falls back to mimalloc's own heap,
// which returns null only when the process is out of memory.
unsafe impl GlobalAlloc for Heap {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocation functions, plain and zeroed.
        unsafe { allocate(layout, mi::mi_heap_malloc_aligned, mi::mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { allocate(layout, mi::mi_heap_zalloc_aligned, mi::mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from one of mimalloc's heaps.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if let Some(heap) = small(layout.align()) {
            // SAFETY: `ptr` came from one of mimalloc's heaps; on null it
            // is left as it was.
            let p = unsafe {
                mi::mi_heap_realloc_aligned(heap, ptr.cast::<c_void>(), new_size, layout.align())
            };
            if let Some(p) = from_arena(p) {
                return p;
            }
        }
        // SAFETY: as above.
        unsafe { mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast() }
    }
}

/// How much address space the arena maps: the machine's memory, in
/// whole 64 MiB, at least 64 MiB and at most 8 GiB (mimalloc 3 takes
/// external memory of up to 15 GiB as one arena). None of it is used
/// until touched (`MAP_NORESERVE`).
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
    physical.clamp(64 << 20, 8 << 30) & !((64 << 20) - 1)
}

/// The small-page arena, once set up.
#[derive(Clone, Copy, Debug)]
pub struct Arena {
    /// Where it starts.
    pub start: usize,
    /// How many bytes it spans.
    pub bytes: usize,
}

/// Map an arena without huge pages and make it where [`Heap`] allocates;
/// the arena, or the error (then allocations stay in mimalloc's heap).
/// Called once, at the start of `serve`; a second call keeps the first
/// arena.
pub fn use_small_pages() -> Result<Arena, i32> {
    use_small_pages_of(arena_bytes())
}

fn use_small_pages_of(bytes: usize) -> Result<Arena, i32> {
    static ARENA: std::sync::OnceLock<Result<Arena, i32>> = std::sync::OnceLock::new();
    *ARENA.get_or_init(|| {
        // One slice more, to start the arena on a slice (mimalloc would
        // otherwise drop a whole 32 MiB chunk of it).
        let mapped = bytes + ARENA_ALIGN;
        // SAFETY: a new private anonymous mapping; nothing else uses it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM));
        }
        let start = (base as usize).next_multiple_of(ARENA_ALIGN);
        // SAFETY: `start..start + bytes` lies inside the mapping. Small
        // pages even where the kernel gives huge pages to every mapping.
        unsafe { libc::madvise(start as *mut c_void, bytes, libc::MADV_NOHUGEPAGE) };
        let mut id: mi::mi_arena_id_t = std::ptr::null_mut();
        // Committed (read-write), not pinned (mimalloc may give back what
        // it frees), zeroed (fresh), any NUMA node, exclusive (only the
        // heap made for it allocates there).
        // SAFETY: the range is ours for the life of the process.
        let managed = unsafe {
            mi::mi_manage_os_memory_ex(
                start as *const c_void,
                bytes,
                true,
                false,
                true,
                -1,
                true,
                &mut id,
            )
        };
        // SAFETY: `id` names the arena just made.
        let heap = if managed {
            unsafe { mi::mi_heap_new_in_arena(id) }
        } else {
            std::ptr::null_mut()
        };
        if heap.is_null() {
            // Unmapped only if mimalloc never took it: an arena it manages
            // stays registered (its header inside the range, read by every
            // later arena search), so that mapping is left to it.
            if !managed {
                // SAFETY: the mapping made above, which nothing uses.
                unsafe { libc::munmap(base, mapped) };
            }
            return Err(libc::ENOMEM);
        }
        SMALL.store(heap, Ordering::Release);
        Ok(Arena { start, bytes })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" {
        // mimalloc 3's (the bindings name only version 2's).
        fn mi_heap_contains(heap: *const mi::mi_heap_t, p: *const c_void) -> bool;
    }

    /// One test: a test filling the arena while another checks where its
    /// blocks come from would race it.
    #[test]
    fn blocks_come_from_the_arena_and_then_from_mimallocs_heap() {
        // 64 MiB of arena, so that the test can fill it.
        let arena = use_small_pages_of(64 << 20).expect("an arena of 64 MiB");
        assert_eq!(arena.start % ARENA_ALIGN, 0);
        let heap = SMALL.load(Ordering::Acquire);
        blocks_come_from_the_arena_keep_their_contents_and_alignment(heap);
        a_full_arena_leaves_allocations_to_mimallocs_heap(heap);
    }

    fn blocks_come_from_the_arena_keep_their_contents_and_alignment(heap: *mut mi::mi_heap_t) {
        let cases = [
            (1, 1),
            (24, 8),
            (4096, 4096),
            (100_000, 64),
            (3 << 20, 16),
            (8, 1 << 20),
        ];
        for (size, align) in cases {
            let layout = Layout::from_size_align(size, align).unwrap();
            // Past a slice's alignment, only mimalloc's own arenas can.
            let in_arena = align <= ARENA_ALIGN;
            unsafe {
                let p = Heap.alloc(layout);
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "alignment {align}");
                assert_eq!(
                    mi_heap_contains(heap, p.cast()),
                    in_arena,
                    "{size} bytes, {align}"
                );
                std::ptr::write_bytes(p, 0xA5, size);
                let q = Heap.realloc(p, layout, size * 2 + 7);
                assert_eq!(q as usize % align, 0);
                assert_eq!(mi_heap_contains(heap, q.cast()), in_arena, "grown {size}");
                assert!(
                    std::slice::from_raw_parts(q, size)
                        .iter()
                        .all(|&b| b == 0xA5)
                );
                Heap.dealloc(q, Layout::from_size_align(size * 2 + 7, align).unwrap());
                let z = Heap.alloc_zeroed(layout);
                assert_eq!(mi_heap_contains(heap, z.cast()), in_arena, "zeroed {size}");
                assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                Heap.dealloc(z, layout);
            }
        }
        assert!(!FULL.load(Ordering::Relaxed));
    }

    fn a_full_arena_leaves_allocations_to_mimallocs_heap(heap: *mut mi::mi_heap_t) {
        let layout = Layout::from_size_align(1 << 20, 8).unwrap();
        // 96 MiB of live blocks from a 64 MiB arena: all given, the first
        // ones from the arena, those after its first refusal from
        // mimalloc's heap; every one usable and freed.
        let blocks: Vec<*mut u8> = (0..96)
            .map(|i| unsafe {
                let p = Heap.alloc(layout);
                assert!(!p.is_null(), "block {i}");
                p.write(i as u8);
                p
            })
            .collect();
        let inside: Vec<bool> = blocks
            .iter()
            .map(|&p| unsafe { mi_heap_contains(heap, p.cast()) })
            .collect();
        let first_out = inside.iter().position(|&i| !i).expect("a block outside");
        assert!(first_out > 0, "no block in the arena");
        assert!(inside[first_out..].iter().all(|&i| !i), "{inside:?}");
        assert!(FULL.load(Ordering::Relaxed));
        for (i, p) in blocks.into_iter().enumerate() {
            unsafe {
                assert_eq!(p.read(), i as u8);
                Heap.dealloc(p, layout);
            }
        }
        // Room again, but the arena stays passed over.
        let p = unsafe { Heap.alloc(Layout::from_size_align(64, 8).unwrap()) };
        assert!(!unsafe { mi_heap_contains(heap, p.cast()) });
        unsafe { Heap.dealloc(p, Layout::from_size_align(64, 8).unwrap()) };
    }
}
