//! The allocator of plugins built for `wasm32-unknown-unknown` (the lean
//! build, see README "Writing a plugin").
//!
//! That target has no C library, so nothing imports WASI: the component
//! imports only the marketplace interfaces it uses, and each request's
//! fresh instance links fewer functions (about 1.5 µs of a trivial call
//! in-process, more through the server). But std's own allocator there
//! asks `memory.grow` for every region it uses and never uses the memory
//! the module starts with past its data and stack, so every request would
//! grow the instance's memory, which the host pays for in page-table
//! changes when the pooled slot is reset. This one is the same dlmalloc,
//! given the initial memory first (from `__heap_base` to the end of memory,
//! all zero in a fresh instance) and grown pages after it.

use core::alloc::{GlobalAlloc, Layout};
use core::arch::wasm32;
use core::cell::UnsafeCell;

const PAGE: usize = 65536;

unsafe extern "C" {
    /// Where the linker put the end of the data and stack.
    static __heap_base: u8;
}

/// Hands dlmalloc the initial memory's free part once, then grown pages.
struct Memory {
    claimed: UnsafeCell<bool>,
}

// SAFETY: a wasm32-unknown-unknown instance without the `atomics` feature
// has one thread.
unsafe impl Send for Memory {}

/// Grow memory 0 by enough pages for `bytes`; the old end, or None.
fn grow(bytes: usize) -> Option<usize> {
    let pages = bytes.div_ceil(PAGE);
    let old = wasm32::memory_grow(0, pages);
    (old != usize::MAX).then(|| old * PAGE)
}

// SAFETY: the regions returned are memory no one else uses: the part of
// the initial memory past `__heap_base` (once) and freshly grown pages.
unsafe impl dlmalloc::Allocator for Memory {
    fn alloc(&self, size: usize) -> (*mut u8, usize, u32) {
        let end = wasm32::memory_size(0) * PAGE;
        // SAFETY: one thread (see `Send` above); nothing else reads it.
        let claimed = unsafe { &mut *self.claimed.get() };
        let (start, wanted) = if *claimed {
            (end, size)
        } else {
            let base = core::ptr::addr_of!(__heap_base) as usize;
            (base, size.saturating_sub(end.saturating_sub(base)))
        };
        if wanted > 0 && grow(wanted).is_none() {
            return (core::ptr::null_mut(), 0, 0);
        }
        *claimed = true;
        let new_end = wasm32::memory_size(0) * PAGE;
        (start as *mut u8, new_end - start, 0)
    }

    fn remap(&self, _: *mut u8, _: usize, _: usize, _: bool) -> *mut u8 {
        core::ptr::null_mut()
    }

    fn free_part(&self, _: *mut u8, _: usize, _: usize) -> bool {
        false
    }

    fn free(&self, _: *mut u8, _: usize) -> bool {
        false
    }

    fn can_release_part(&self, _: u32) -> bool {
        false
    }

    fn allocates_zeros(&self) -> bool {
        true
    }

    fn page_size(&self) -> usize {
        PAGE
    }
}

struct Heap(UnsafeCell<dlmalloc::Dlmalloc<Memory>>);

// SAFETY: one thread (see `Memory`).
unsafe impl Sync for Heap {}

impl Heap {
    #[allow(clippy::mut_from_ref, reason = "one thread, no reentrancy")]
    fn get(&self) -> &mut dlmalloc::Dlmalloc<Memory> {
        // SAFETY: one thread, and no allocation runs inside another.
        unsafe { &mut *self.0.get() }
    }
}

// SAFETY: forwards to dlmalloc with the layout's size and alignment.
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { self.get().malloc(layout.size(), layout.align()) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe { self.get().calloc(layout.size(), layout.align()) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { self.get().free(ptr, layout.size(), layout.align()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe {
            self.get()
                .realloc(ptr, layout.size(), layout.align(), new_size)
        }
    }
}

#[global_allocator]
static HEAP: Heap = Heap(UnsafeCell::new(dlmalloc::Dlmalloc::new_with_allocator(
    Memory {
        claimed: UnsafeCell::new(false),
    },
)));
