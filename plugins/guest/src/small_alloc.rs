//! The lean build's allocator in front of dlmalloc: blocks of up to
//! [`MAX_SMALL`] bytes (and alignment up to 8) come from one free list per
//! power-of-two size, carved from 16 KiB slabs that dlmalloc hands out;
//! anything larger goes to dlmalloc itself. An instance serves one request
//! and is thrown away, and a request makes hundreds of small allocations
//! (keys, JSON strings, vectors of a few entries): taking a block off a
//! list is a few instructions where dlmalloc's bins and coalescing cost
//! about a hundred (under callgrind dlmalloc was 42k instructions of a
//! paid post and 61k of a search). Freed blocks go back to their list, so
//! a loop that allocates and frees reuses the same memory (few pages
//! dirtied, which keeps the pooled slot's reset cheap); memory of one size
//! is not reused for another, which a one-request instance can afford.
//!
//! `dealloc` and `realloc` are told the block's layout, so blocks carry
//! no header: the size class is computed from the size.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr::null_mut;

/// Size classes: 8, 16, ... 2048 bytes.
const CLASSES: usize = 9;
/// The largest block served from the free lists.
pub const MAX_SMALL: usize = 8 << (CLASSES - 1);
/// What one refill takes from the backing allocator.
const SLAB: usize = 16 << 10;

/// Small blocks from free lists, the rest from `A`.
pub struct Small<A> {
    backing: A,
    state: UnsafeCell<State>,
}

struct State {
    /// Each class's list of freed blocks, linked through their first word.
    free: [*mut u8; CLASSES],
    /// The part of the current slab not handed out yet.
    next: *mut u8,
    end: *mut u8,
}

// SAFETY: only the lean build (wasm32-unknown-unknown, which has no
// threads) uses one as the global allocator; tests use their own, from one
// thread.
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
unsafe impl<A: Sync> Sync for Small<A> {}

impl<A> Small<A> {
    pub const fn new(backing: A) -> Small<A> {
        Small {
            backing,
            state: UnsafeCell::new(State {
                free: [null_mut(); CLASSES],
                next: null_mut(),
                end: null_mut(),
            }),
        }
    }
}

/// The class of a block of `layout`, if it is small.
fn class(layout: Layout) -> Option<usize> {
    if layout.size() > MAX_SMALL || layout.align() > 8 {
        return None;
    }
    let size = layout.size().max(8).next_power_of_two();
    Some((size.trailing_zeros() - 3) as usize)
}

unsafe impl<A: GlobalAlloc> GlobalAlloc for Small<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class(layout) else {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.backing.alloc(layout) };
        };
        // SAFETY: one thread (see `Sync`), and no call below re-enters.
        let st = unsafe { &mut *self.state.get() };
        let head = st.free[c];
        if !head.is_null() {
            // SAFETY: a freed block of this class holds the next one's
            // address in its first word (written by `dealloc`).
            st.free[c] = unsafe { head.cast::<*mut u8>().read() };
            return head;
        }
        let size = 8 << c;
        if (st.end as usize) - (st.next as usize) < size {
            // SAFETY: a non-zero size and a valid alignment.
            let slab = unsafe {
                self.backing
                    .alloc(Layout::from_size_align_unchecked(SLAB, 8))
            };
            if slab.is_null() {
                return slab;
            }
            st.next = slab;
            // SAFETY: the slab is SLAB bytes long.
            st.end = unsafe { slab.add(SLAB) };
        }
        let block = st.next;
        // SAFETY: `size` bytes are left in the slab (checked above).
        st.next = unsafe { block.add(size) };
        block
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(c) = class(layout) else {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.backing.dealloc(ptr, layout) };
        };
        // SAFETY: one thread; the block is at least 8 bytes, 8-aligned,
        // and no longer in use (the caller's contract).
        unsafe {
            let st = &mut *self.state.get();
            ptr.cast::<*mut u8>().write(st.free[c]);
            st.free[c] = ptr;
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if class(layout).is_none() {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.backing.alloc_zeroed(layout) };
        }
        // SAFETY: as `alloc`; a reused block is zeroed here.
        unsafe {
            let ptr = self.alloc(layout);
            if !ptr.is_null() {
                ptr.write_bytes(0, layout.size());
            }
            ptr
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` rounded up to the
        // alignment does not overflow.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class(layout), class(new_layout)) {
            // The block already has room.
            (Some(a), Some(b)) if a == b => ptr,
            // SAFETY: the caller's contract, passed on.
            (None, None) => unsafe { self.backing.realloc(ptr, layout, new_size) },
            // SAFETY: a new block, the old one's bytes copied over, then
            // the old one freed.
            _ => unsafe {
                let new = self.alloc(new_layout);
                if !new.is_null() {
                    core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                new
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    /// A deterministic stream of numbers (no dependency for a test).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self, below: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 33) as usize) % below
        }
    }

    struct Block {
        ptr: *mut u8,
        layout: Layout,
        tag: u8,
    }

    fn fill(b: &Block) {
        // SAFETY: the block is live and `layout.size()` long.
        unsafe { b.ptr.write_bytes(b.tag, b.layout.size()) };
    }

    fn intact(b: &Block) -> bool {
        // SAFETY: as `fill`.
        let bytes = unsafe { std::slice::from_raw_parts(b.ptr, b.layout.size()) };
        bytes.iter().all(|&x| x == b.tag)
    }

    #[test]
    fn blocks_keep_their_bytes_and_alignment_through_any_sequence() {
        let heap = Small::new(System);
        let mut rng = Lcg(7);
        let mut live: Vec<Block> = Vec::new();
        for step in 0..40_000u32 {
            let tag = (step % 251) as u8 + 1;
            match rng.next(10) {
                // Allocate: mostly small, some past MAX_SMALL, any alignment.
                0..=4 => {
                    let size = match rng.next(10) {
                        0 => rng.next(3 * MAX_SMALL) + 1,
                        _ => rng.next(300) + 1,
                    };
                    let align = 1 << rng.next(5);
                    let layout = Layout::from_size_align(size, align).unwrap();
                    // SAFETY: a non-zero size.
                    let ptr = unsafe {
                        if rng.next(4) == 0 {
                            let p = heap.alloc_zeroed(layout);
                            let zeroed = std::slice::from_raw_parts(p, size);
                            assert!(zeroed.iter().all(|&x| x == 0), "not zeroed");
                            p
                        } else {
                            heap.alloc(layout)
                        }
                    };
                    assert!(!ptr.is_null());
                    assert_eq!(ptr as usize % align, 0, "misaligned");
                    let b = Block { ptr, layout, tag };
                    fill(&b);
                    live.push(b);
                }
                // Free one.
                5..=7 if !live.is_empty() => {
                    let b = live.swap_remove(rng.next(live.len()));
                    assert!(intact(&b), "a block's bytes changed at step {step}");
                    // SAFETY: allocated above with this layout, freed once.
                    unsafe { heap.dealloc(b.ptr, b.layout) };
                }
                // Grow or shrink one: its bytes up to the smaller size stay.
                8..=9 if !live.is_empty() => {
                    let i = rng.next(live.len());
                    let b = &mut live[i];
                    assert!(intact(b), "a block's bytes changed at step {step}");
                    let new_size = match rng.next(6) {
                        0 => rng.next(3 * MAX_SMALL) + 1,
                        _ => rng.next(2 * b.layout.size() + 16) + 1,
                    };
                    // SAFETY: a live block, its layout, a non-zero size.
                    let ptr = unsafe { heap.realloc(b.ptr, b.layout, new_size) };
                    assert!(!ptr.is_null());
                    assert_eq!(ptr as usize % b.layout.align(), 0, "misaligned");
                    let kept = b.layout.size().min(new_size);
                    // SAFETY: the new block is at least `kept` long.
                    let bytes = unsafe { std::slice::from_raw_parts(ptr, kept) };
                    assert!(bytes.iter().all(|&x| x == b.tag), "realloc lost bytes");
                    b.ptr = ptr;
                    b.layout = Layout::from_size_align(new_size, b.layout.align()).unwrap();
                    b.tag = tag;
                    fill(b);
                }
                _ => {}
            }
            // Every live block intact now and then: overlapping blocks
            // would have overwritten each other.
            if step % 1000 == 0 {
                assert!(
                    live.iter().all(intact),
                    "a block's bytes changed at step {step}"
                );
            }
        }
        assert!(live.iter().all(intact));
        for b in live {
            // SAFETY: live blocks, each freed once.
            unsafe { heap.dealloc(b.ptr, b.layout) };
        }
    }

    #[test]
    fn a_freed_block_is_handed_out_again() {
        let heap = Small::new(System);
        let layout = Layout::from_size_align(40, 8).unwrap();
        // SAFETY: allocated, freed once, allocated again, freed.
        unsafe {
            let a = heap.alloc(layout);
            let b = heap.alloc(layout);
            assert_ne!(a, b);
            heap.dealloc(a, layout);
            // Same class (33 to 64 bytes): the freed block comes back.
            let c = heap.alloc(Layout::from_size_align(64, 4).unwrap());
            assert_eq!(c, a);
            // A larger class does not get it.
            heap.dealloc(c, Layout::from_size_align(64, 4).unwrap());
            let d = heap.alloc(Layout::from_size_align(65, 8).unwrap());
            assert_ne!(d, a);
            heap.dealloc(d, Layout::from_size_align(65, 8).unwrap());
            heap.dealloc(b, layout);
        }
    }

    #[test]
    fn classes_are_powers_of_two_up_to_the_limit() {
        let l = |size, align| Layout::from_size_align(size, align).unwrap();
        assert_eq!(class(l(0, 1)), Some(0));
        assert_eq!(class(l(8, 8)), Some(0));
        assert_eq!(class(l(9, 1)), Some(1));
        assert_eq!(class(l(2048, 8)), Some(CLASSES - 1));
        assert_eq!(class(l(2049, 1)), None);
        assert_eq!(class(l(16, 16)), None);
    }
}
