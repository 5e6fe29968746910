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
//! arenas: a chunk made among a storm's handshakes would pin the pages around it. The free
//! slot with the lowest address is handed out first, so the slots in use gather at the low
//! end of the lowest chunks and pages become resident only as they are used. A page none of
//! whose slots is in use is given back to the kernel (`MADV_DONTNEED`), and a chunk is unmapped
//! when its last slot is free again, except one spare: a server that held many connections
//! does not keep their memory after they are gone, nor after most of them moved to another
//! pool (an HTTP/2 connection at rest, `super::h2_rest`) while a few, scattered, stay. The
//! slots are found under one lock, taken once when a value is made and once when it is
//! dropped.
#![allow(unsafe_code)]

use std::alloc::{handle_alloc_error, Layout};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
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
    /// Taken lowest address first.
    free: BinaryHeap<Reverse<Free>>,
    /// Chunks none of whose slots are in use.
    empty: usize,
    /// The kernel's page size, once the first chunk is made.
    page: usize,
}

struct Chunk {
    start: usize,
    live: usize,
    /// Slots in use on each page of the chunk (a slot may span two).
    pages: Box<[u32]>,
}

/// A free slot, ordered by address.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Free(NonNull<u8>);

// SAFETY: the pointers are to memory this pool owns; it is only reached through the lock.
unsafe impl Send for Slots {}

impl Slots {
    /// No chunk yet, for values of layout `slot` (its size a multiple of its alignment, as
    /// every type's is).
    pub const fn new(slot: Layout) -> Slots {
        Slots {
            slot,
            chunks: Vec::new(),
            free: BinaryHeap::new(),
            empty: 0,
            page: 4096,
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
        let at = p.addr().get();
        let i = self
            .chunks
            .partition_point(|c| c.start <= at)
            .checked_sub(1)?;
        let chunk = self.chunks.get(i)?;
        (at < chunk.start + CHUNK).then_some(i)
    }

    /// The pages of chunk `i` that slot `p` lies on, as a range of page indexes.
    fn pages_of(&self, i: usize, p: NonNull<u8>) -> std::ops::Range<usize> {
        let offset = self
            .chunks
            .get(i)
            .map_or(0, |c| p.addr().get().saturating_sub(c.start));
        let last = offset + self.stride().max(1) - 1;
        offset / self.page..last / self.page + 1
    }

    /// A free slot, from a new chunk if none is: the lowest free one, so the slots in use
    /// gather at the low end and the pages above them stay empty.
    fn take(&mut self) -> NonNull<u8> {
        if self.free.is_empty() {
            self.grow();
        }
        let Some(Reverse(Free(p))) = self.free.pop() else {
            handle_alloc_error(self.chunk_layout())
        };
        let Some(i) = self.chunk_of(p) else {
            return p; // Not reached: every free slot is in a chunk.
        };
        let pages = self.pages_of(i, p);
        if let Some(chunk) = self.chunks.get_mut(i) {
            chunk.live += 1;
            if chunk.live == 1 {
                self.empty -= 1;
            }
            for n in chunk.pages.get_mut(pages).unwrap_or_default() {
                *n += 1;
            }
        }
        p
    }

    fn grow(&mut self) {
        assert!(
            self.slot.align() <= 4096 && self.stride() <= CHUNK,
            "a slot fits a chunk"
        );
        // SAFETY: `sysconf` only reads a value.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        self.page = usize::try_from(page)
            .ok()
            .filter(|p| p.is_power_of_two() && *p <= CHUNK)
            .unwrap_or(4096);
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
        let start = base.addr().get();
        let i = self.chunks.partition_point(|c| c.start < start);
        let pages = vec![0; CHUNK / self.page].into_boxed_slice();
        self.chunks.insert(
            i,
            Chunk {
                start,
                live: 0,
                pages,
            },
        );
        self.empty += 1;
        let stride = self.stride();
        for i in 0..self.per_chunk() {
            // SAFETY: within the mapping just made (page-aligned, so any alignment up to a
            // page holds at multiples of the stride).
            self.free
                .push(Reverse(Free(unsafe { base.add(i * stride) })));
        }
    }

    /// Slot `p`, taken from this pool and no longer holding a value, is free again. A page
    /// left without a slot in use is given back to the kernel (the mapping stays; a slot is
    /// written before it is read, so the zero page it finds there later is fine), and a
    /// chunk left without one is unmapped, but for one spare.
    fn give(&mut self, p: NonNull<u8>) {
        let Some(i) = self.chunk_of(p) else {
            debug_assert!(false, "a slot given back to a pool it is not from");
            return;
        };
        let pages = self.pages_of(i, p);
        self.free.push(Reverse(Free(p)));
        let page = self.page;
        let Some(chunk) = self.chunks.get_mut(i) else {
            return;
        };
        let (mut first_empty, mut empty_pages) = (None, 0);
        for (n, at) in chunk
            .pages
            .get_mut(pages.clone())
            .unwrap_or_default()
            .iter_mut()
            .zip(pages)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                first_empty.get_or_insert(at);
                empty_pages += 1;
            }
        }
        if let Some(at) = first_empty {
            // SAFETY: whole pages of the chunk mapped by `grow`, on which no slot is in use.
            unsafe {
                libc::madvise(
                    (chunk.start + at * page) as *mut libc::c_void,
                    empty_pages * page,
                    libc::MADV_DONTNEED,
                )
            };
        }
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
            .retain(|Reverse(Free(p))| !(start..end).contains(&p.addr().get()));
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

/// One pooled value of either of two types in the room of one pointer: the pointer's lowest
/// bit says which (both types' slots are aligned to at least 2). A table of them costs 8
/// bytes a slot where an enum of two [`Pooled`] costs 16.
pub struct Either<A: InPool, B: InPool> {
    tagged: NonNull<u8>,
    _owns: PhantomData<(A, B)>,
}

/// Which of the two an [`Either`] holds.
pub enum Which<A, B> {
    A(A),
    B(B),
}

// SAFETY: an `Either` owns its value as the `Pooled` it was made from does.
unsafe impl<A: InPool + Send, B: InPool + Send> Send for Either<A, B> {}
// SAFETY: as above; `&Either` only gives shared references.
unsafe impl<A: InPool + Sync, B: InPool + Sync> Sync for Either<A, B> {}

impl<A: InPool, B: InPool> Either<A, B> {
    const TAG: usize = 1;
    const ALIGNED: () = assert!(
        std::mem::align_of::<A>() > Self::TAG && std::mem::align_of::<B>() > Self::TAG,
        "both types leave the tag bit free"
    );

    fn untag(p: Pooled<impl InPool>) -> NonNull<u8> {
        std::mem::ManuallyDrop::new(p).ptr.cast()
    }

    /// Holds an `A`.
    pub fn a(value: Pooled<A>) -> Self {
        let () = Self::ALIGNED;
        Either {
            tagged: Self::untag(value),
            _owns: PhantomData,
        }
    }

    /// Holds a `B`.
    pub fn b(value: Pooled<B>) -> Self {
        let () = Self::ALIGNED;
        Either {
            tagged: Self::untag(value).map_addr(|a| a | Self::TAG),
            _owns: PhantomData,
        }
    }

    /// The value's slot, without the tag.
    fn slot(&self) -> Which<NonNull<A>, NonNull<B>> {
        if self.tagged.addr().get() & Self::TAG == 0 {
            Which::A(self.tagged.cast())
        } else {
            // The slot's address, itself at least 2 and even: never zero once untagged.
            let p = self
                .tagged
                .map_addr(|a| std::num::NonZeroUsize::new(a.get() & !Self::TAG).unwrap_or(a));
            Which::B(p.cast())
        }
    }

    pub fn get(&self) -> Which<&A, &B> {
        match self.slot() {
            // SAFETY: the slot holds the value for as long as `self` lives.
            Which::A(p) => Which::A(unsafe { p.as_ref() }),
            // SAFETY: as above.
            Which::B(p) => Which::B(unsafe { p.as_ref() }),
        }
    }

    pub fn get_mut(&mut self) -> Which<&mut A, &mut B> {
        match self.slot() {
            // SAFETY: as in `get`, and `&mut self` is unique.
            Which::A(mut p) => Which::A(unsafe { p.as_mut() }),
            // SAFETY: as above.
            Which::B(mut p) => Which::B(unsafe { p.as_mut() }),
        }
    }

    /// The pooled value, as it was given.
    pub fn into_inner(self) -> Which<Pooled<A>, Pooled<B>> {
        let this = std::mem::ManuallyDrop::new(self);
        this.owner()
    }

    /// The `Pooled` the value was made from: exactly one may exist, so the caller forgets
    /// `self` (`into_inner`) or is its drop.
    fn owner(&self) -> Which<Pooled<A>, Pooled<B>> {
        match self.slot() {
            Which::A(ptr) => Which::A(Pooled {
                ptr,
                _owns: PhantomData,
            }),
            Which::B(ptr) => Which::B(Pooled {
                ptr,
                _owns: PhantomData,
            }),
        }
    }
}

impl<A: InPool, B: InPool> Drop for Either<A, B> {
    fn drop(&mut self) {
        // The value is dropped and its slot given back by the `Pooled` it was made from.
        drop(self.owner());
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
        let spare = lock(&PROBES).chunks[0].start;
        assert_eq!(resident_pages(spare), 0, "without its pages");
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

    /// Pages of the chunk at `start` in memory.
    fn resident_pages(start: usize) -> usize {
        let mut pages = vec![0u8; CHUNK / 4096];
        // SAFETY: a mapping of `CHUNK` bytes at `start`; `pages` has a byte per page.
        let rc = unsafe { libc::mincore(start as *mut libc::c_void, CHUNK, pages.as_mut_ptr()) };
        assert_eq!(rc, 0);
        pages.iter().filter(|&&p| p & 1 == 1).count()
    }

    struct Page([u64; 25]);
    static PAGES: Mutex<Slots> = Mutex::new(Slots::new(Layout::new::<Page>()));
    impl InPool for Page {
        fn slots() -> &'static Mutex<Slots> {
            &PAGES
        }
    }

    #[test]
    fn pages_without_a_slot_in_use_are_given_back_and_the_lowest_slots_go_first() {
        let stride = std::mem::size_of::<Page>();
        let per_chunk = lock(&PAGES).per_chunk();
        let mut held: Vec<Pooled<Page>> = (0..per_chunk)
            .map(|i| Pooled::new(Page([i as u64; 25])))
            .collect();
        let start = lock(&PAGES).chunks[0].start;
        assert_eq!(resident_pages(start), CHUNK / 4096, "every page written");
        // One in a hundred stays, scattered over the chunk (200 bytes each: about 20 a page):
        // only the pages they lie on stay resident.
        held.retain(|p| p.0[0] % 100 == 0);
        let mut pages: Vec<usize> = held
            .iter()
            .flat_map(|p| {
                let at = p.0[0] as usize * stride;
                [at / 4096, (at + stride - 1) / 4096]
            })
            .collect();
        pages.dedup();
        assert!(pages.len() < CHUNK / 4096 / 2);
        assert_eq!(resident_pages(start), pages.len());
        // New values take the lowest free slots: the chunk's start, but for slot 0, in order.
        let again: Vec<Pooled<Page>> = (0..5).map(|_| Pooled::new(Page([7; 25]))).collect();
        let at: Vec<usize> = again.iter().map(|p| &**p as *const Page as usize).collect();
        assert_eq!(at, (1..6).map(|i| start + i * stride).collect::<Vec<_>>());
        drop(again);
        drop(held);
        assert_eq!(lock(&PAGES).counts(), (0, 1));
        assert_eq!(resident_pages(start), 0);
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

    /// Values of this test's own (the other tests count drops and slots of theirs).
    struct Left(u64, String);
    struct Right(Vec<u8>);
    static LEFT_DROPS: AtomicUsize = AtomicUsize::new(0);
    static LEFTS: Mutex<Slots> = Mutex::new(Slots::new(Layout::new::<Left>()));
    static RIGHTS: Mutex<Slots> = Mutex::new(Slots::new(Layout::new::<Right>()));
    impl Drop for Left {
        fn drop(&mut self) {
            LEFT_DROPS.fetch_add(1, Relaxed);
        }
    }
    impl InPool for Left {
        fn slots() -> &'static Mutex<Slots> {
            &LEFTS
        }
    }
    impl InPool for Right {
        fn slots() -> &'static Mutex<Slots> {
            &RIGHTS
        }
    }

    #[test]
    fn either_holds_one_of_two_in_a_pointer_s_room() {
        assert_eq!(std::mem::size_of::<Option<Either<Left, Right>>>(), 8);
        let mut held = vec![
            Either::<Left, Right>::a(Pooled::new(Left(1, "left".into()))),
            Either::b(Pooled::new(Right(vec![1, 2]))),
        ];
        for e in &mut held {
            match e.get_mut() {
                Which::A(l) => l.0 = 9,
                Which::B(r) => r.0.push(3),
            }
        }
        assert!(matches!(held[0].get(), Which::A(l) if l.0 == 9 && l.1 == "left"));
        assert!(matches!(held[1].get(), Which::B(r) if r.0 == [1, 2, 3]));
        let Some(Which::B(right)) = held.pop().map(Either::into_inner) else {
            panic!("a B");
        };
        assert_eq!(right.0, [1, 2, 3]);
        assert_eq!(lock(&RIGHTS).counts().0, 1, "moved out, still in its slot");
        drop(right);
        assert_eq!(lock(&RIGHTS).counts().0, 0);
        assert_eq!(LEFT_DROPS.load(Relaxed), 0, "nothing dropped while held");
        drop(held);
        assert_eq!(LEFT_DROPS.load(Relaxed), 1, "dropped with its Either");
        assert_eq!(lock(&LEFTS).counts().0, 0, "and its slot given back");
    }
}
