//! The counting allocator behind the JSONata allocation budget.
//!
//! [`Counting`] wraps the system allocator and reports every allocation and
//! release to the evaluator's per-thread counter
//! (`jsonata_core::bounds`), so an evaluation that builds values step by
//! step (a path over a range, an object constructor, recursion) stops at its
//! budget instead of filling the heap. The `streamhost` binary installs it;
//! an embedding program that wants the same bound installs it too (it is
//! public as `streamhost::CountingAllocator`).
//!
//! Without it, the bounds checked before and after every built-in still
//! hold; only the budget of values built step by step does not.

use std::alloc::{GlobalAlloc, Layout, System};

/// The system allocator, counting bytes per thread for the JSONata budget.
pub struct Counting;

// SAFETY: every call is forwarded to `System` unchanged; the counting only
// touches a const-initialised thread-local `Cell` (no allocation, no drop).
unsafe impl GlobalAlloc for Counting {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            jsonata_core::bounds::allocated(layout.size());
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            jsonata_core::bounds::allocated(layout.size());
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        jsonata_core::bounds::released(layout.size());
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            jsonata_core::bounds::released(layout.size());
            jsonata_core::bounds::allocated(new_size);
        }
        p
    }
}
