//! A pool of same-sized slots for the heap records a connection keeps for its whole life (a TLS
//! connection's [`super::tls::Session`], an HTTP/2 connection's protocol state), so that the
//! records of long-lived connections sit side by side.
//!
//! Why: a TLS handshake borrows kilobytes of many sizes and frees them when it ends. A session
//! boxed by the general allocator lands among those borrowings, and when thousands of clients
//! connect at once the freed handshake memory stays behind as holes between the sessions,
//! too small or too scattered to become whole free pages: about 200 B per idle connection,
//! as much again as the session itself. From this pool the sessions fill chunks of [`CHUNK`]
//! bytes densely, the handshakes' memory is left in one piece, and [`super::trim`] gives its
//! pages back once the storm is over.
//!
//! The chunks are mapped from the kernel directly (`mmap`), not taken from the allocator's
//! arenas: a chunk made among a storm's handshakes would pin the pages around it. Slots are
//! handed out from a chunk's start, so its pages become resident only as they are used. A
//! chunk is unmapped when its last slot is free again, except one spare, so a server that held
//! many connections does not keep their memory after they are gone. The slots are found under
//! one lock, taken once when a session is made and once when it is dropped.
#![allow(unsafe_code)]

use std::alloc::{handle_alloc_error, Layout};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::hub::lock;

/// A chunk's size: 1,213 TLS sessions.
pub(crate) const CHUNK: usize = 256 * 1024;

/// The slots of one size and alignment: chunks of [`CHUNK`] bytes, and which slots are free.
pub struct Slots {
    slot: Layout,
    /// Sorted by address.
    chunks: Vec<Chunk>,
    free: Vec<NonNull<u8>>,
    /// Chunks none of whose slots are in use.
    empty: usize,
}

struct Chunk {
    start: usize,
    live: usize,
}

// SAFETY: the pointers are to memory this pool owns; it is only reached through the lock.
unsafe impl Send for Slots {}

impl Slots {
    /// No chunk yet, for values of layout `slot` (its size a multiple of its alignment, as
    /// every type's is).
    pub const fn new(slot: Layout) -> Slots {
        Slots {
            slot,
            chunks: Vec::new(),
            free: Vec::new(),
            empty: 0,
        }
    }

    /// The distance between slots: the size, a multiple of the alignment (a zero-sized type
    /// still takes its alignment, so that every slot is aligned).
    fn stride(&self) -> usize {
        self.slot.size().max(self.slot.align())
    }

    /// Slots per chunk.
    pub(crate) fn per_chunk(&self) -> usize {
        CHUNK / self.stride()
    }

    /// A chunk's layout, for `handle_alloc_error`.
    fn chunk_layout(&self) -> Layout {
        Layout::from_size_align(CHUNK, 4096).unwrap_or(self.slot)
    }

    /// The index of the chunk holding `p`, if one does.
    fn chunk_of(&self, p: NonNull<u8>) -> Option<usize> {
        let at = p.as_ptr() as usize;
        let i = self
            .chunks
            .partition_point(|c| c.start <= at)
            .checked_sub(1)?;
        let chunk = self.chunks.get(i)?;
        (at < chunk.start + CHUNK).then_some(i)
    }

    /// A free slot, from a new chunk if none is.
    fn take(&mut self) -> NonNull<u8> {
        if self.free.is_empty() {
            self.grow();
        }
        let Some(p) = self.free.pop() else {
            handle_alloc_error(self.chunk_layout())
        };
        if let Some(chunk) = self.chunk_of(p).and_then(|i| self.chunks.get_mut(i)) {
            chunk.live += 1;
            if chunk.live == 1 {
                self.empty -= 1;
            }
        }
        p
    }

    fn grow(&mut self) {
        assert!(
            self.slot.align() <= 4096 && self.stride() <= CHUNK,
            "a slot fits a chunk"
        );
        // SAFETY: a new private anonymous mapping; nothing else refers to it.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHUNK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        let base = match NonNull::new(at.cast::<u8>()) {
            Some(b) if at != libc::MAP_FAILED => b,
            _ => handle_alloc_error(self.chunk_layout()),
        };
        let start = base.as_ptr() as usize;
        let i = self.chunks.partition_point(|c| c.start < start);
        self.chunks.insert(i, Chunk { start, live: 0 });
        self.empty += 1;
        let stride = self.stride();
        // Handed out from the chunk's start (the free list is taken from its end), so its
        // pages are touched in order, as they are needed.
        for i in (0..self.per_chunk()).rev() {
            // SAFETY: within the mapping just made (page-aligned, so any alignment up to a
            // page holds at multiples of the stride).
            self.free.push(unsafe { base.add(i * stride) });
        }
    }

    /// Slot `p`, taken from this pool and no longer holding a value, is free again.
    fn give(&mut self, p: NonNull<u8>) {
        let Some(i) = self.chunk_of(p) else {
            debug_assert!(false, "a slot given back to a pool it is not from");
            return;
        };
        self.free.push(p);
        let Some(chunk) = self.chunks.get_mut(i) else {
            return;
        };
        chunk.live -= 1;
        if chunk.live > 0 {
            return;
        }
        let start = chunk.start;
        self.empty += 1;
        if self.empty > 1 {
            self.release(i, start);
        }
    }

    /// Gives chunk `i`, at `start`, whose slots are all free, back to the kernel.
    fn release(&mut self, i: usize, start: usize) {
        let end = start + CHUNK;
        self.free
            .retain(|p| !(start..end).contains(&(p.as_ptr() as usize)));
        self.chunks.remove(i);
        self.empty -= 1;
        // SAFETY: mapped by `grow` with this size; none of its slots is in use.
        unsafe { libc::munmap(start as *mut libc::c_void, CHUNK) };
    }

    /// Slots in use and chunks held, for tests.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        (self.chunks.iter().map(|c| c.live).sum(), self.chunks.len())
    }
}

/// A type whose values live in a pool of their own.
pub trait InPool: Sized {
    /// The pool (a `static`, made with `Slots::new(Layout::new::<Self>())`).
    fn slots() -> &'static Mutex<Slots>;
}

/// A value in its type's pool, owned as a `Box` owns its value.
pub struct Pooled<T: InPool> {
    ptr: NonNull<T>,
    _owns: PhantomData<T>,
}

// SAFETY: a `Pooled<T>` owns its `T` as a `Box<T>` does; the pool is behind a lock.
unsafe impl<T: InPool + Send> Send for Pooled<T> {}
// SAFETY: as above; `&Pooled<T>` only gives `&T`.
unsafe impl<T: InPool + Sync> Sync for Pooled<T> {}

impl<T: InPool> Pooled<T> {
    /// `value`, moved into a slot of its pool.
    pub fn new(value: T) -> Pooled<T> {
        let ptr = lock(T::slots()).take().cast::<T>();
        // SAFETY: a free slot of `T`'s layout.
        unsafe { ptr.as_ptr().write(value) };
        Pooled {
            ptr,
            _owns: PhantomData,
        }
    }

    /// The value, moved out; its slot is free again.
    pub fn into_inner(self) -> T {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: the slot holds a `T`, read once: `this` is not dropped, so it is not read or
        // dropped again.
        let value = unsafe { this.ptr.as_ptr().read() };
        lock(T::slots()).give(this.ptr.cast());
        value
    }
}

impl<T: InPool> Deref for Pooled<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the slot holds a `T` for as long as `self` lives.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: InPool> DerefMut for Pooled<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` is unique.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T: InPool> Drop for Pooled<T> {
    fn drop(&mut self) {
        // SAFETY: the slot holds a `T` that nothing else will touch.
        unsafe { std::ptr::drop_in_place(self.ptr.as_ptr()) };
        lock(T::slots()).give(self.ptr.cast());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    static DROPS: AtomicUsize = AtomicUsize::new(0);

    struct Probe([u64; 27], String);

    impl Drop for Probe {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Relaxed);
        }
    }

    static PROBES: Mutex<Slots> = Mutex::new(Slots::new(Layout::new::<Probe>()));

    impl InPool for Probe {
        fn slots() -> &'static Mutex<Slots> {
            &PROBES
        }
    }

    fn probe(i: u64) -> Pooled<Probe> {
        Pooled::new(Probe([i; 27], format!("probe {i}")))
    }

    #[test]
    fn values_keep_their_slots_and_chunks_go_when_empty() {
        let per_chunk = lock(&PROBES).per_chunk();
        assert_eq!(per_chunk, CHUNK / std::mem::size_of::<Probe>());
        let n = per_chunk * 2 + per_chunk / 2;
        let mut held: Vec<Pooled<Probe>> = (0..n).map(|i| probe(i as u64)).collect();
        assert_eq!(lock(&PROBES).counts(), (n, 3));
        for (i, p) in held.iter_mut().enumerate() {
            assert_eq!(p.0[26], i as u64);
            assert_eq!(p.1, format!("probe {i}"));
            p.0[0] = 7;
        }
        // Side by side: one chunk's values are one slot apart.
        let a = &*held[0] as *const Probe as usize;
        let b = &*held[1] as *const Probe as usize;
        assert_eq!(b - a, std::mem::size_of::<Probe>());
        let before = DROPS.load(Relaxed);
        let odd = n / 2;
        held.retain(|p| p.0[26] % 2 == 0);
        assert_eq!(DROPS.load(Relaxed) - before, odd, "each value dropped once");
        assert_eq!(lock(&PROBES).counts(), (n - odd, 3));
        held.extend((0..odd as u64).map(probe));
        assert_eq!(
            lock(&PROBES).counts(),
            (n, 3),
            "freed slots are used again before a new chunk"
        );
        held.clear();
        assert_eq!(lock(&PROBES).counts(), (0, 1), "one spare chunk kept");
        let mut again: Vec<Pooled<Probe>> = (0..3).map(probe).collect();
        assert_eq!(lock(&PROBES).counts(), (3, 1));
        let out = again.pop().map(Pooled::into_inner);
        assert_eq!(
            lock(&PROBES).counts(),
            (2, 1),
            "a value moved out frees its slot"
        );
        assert_eq!(
            DROPS.load(Relaxed) - before,
            odd + n,
            "and is not dropped there"
        );
        assert_eq!(out.as_ref().map(|p| p.0[26]), Some(2));
        drop(out);
        drop(again);
        assert_eq!(DROPS.load(Relaxed) - before, odd + n + 3);
    }

    #[test]
    fn zero_sized_values_are_aligned() {
        #[repr(align(16))]
        struct Empty;
        static EMPTIES: Mutex<Slots> = Mutex::new(Slots::new(Layout::new::<Empty>()));
        impl InPool for Empty {
            fn slots() -> &'static Mutex<Slots> {
                &EMPTIES
            }
        }
        let held: Vec<Pooled<Empty>> = (0..3).map(|_| Pooled::new(Empty)).collect();
        for e in &held {
            assert_eq!(&**e as *const Empty as usize % 16, 0);
        }
    }

    #[test]
    fn values_move_between_threads() {
        let p = Pooled::new(Moved(vec![1, 2, 3]));
        let q = std::thread::spawn(move || {
            assert_eq!(p.0, [1, 2, 3]);
            p
        })
        .join()
        .expect("the thread ends");
        drop(q);
        assert_eq!(lock(&MOVED).counts(), (0, 1));
    }

    struct Moved(Vec<u8>);
    static MOVED: Mutex<Slots> = Mutex::new(Slots::new(Layout::new::<Moved>()));
    impl InPool for Moved {
        fn slots() -> &'static Mutex<Slots> {
            &MOVED
        }
    }
}
