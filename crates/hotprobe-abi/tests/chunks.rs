//! Thread slots that grow in chunks (`SlotDirectory`): a memfd sized for
//! every chunk, mapped up to the first one by two views (the tracer's and,
//! as the agent does, a second mapping of the same file); slots past the
//! first chunk are claimed, written through one view and read through the
//! other, each view mapping the chunks it looks at; the cap is a cap.

use std::sync::atomic::Ordering::Relaxed;

use hotprobe_abi::*;

const N_THREADS: u32 = 4;
const CAP: u32 = 10;

fn params() -> Params {
    Params {
        n_probes: 4,
        n_site_slots: 8,
        n_threads: N_THREADS,
        ring_capacity: 8,
        event_size: EVENT_SIZE_COMPACT,
    }
}

/// A memfd of `file_len` bytes, its first `len` mapped shared.
fn memfd_mapping(file_len: usize, len: usize) -> (i32, *mut u8) {
    // SAFETY: a NUL-terminated name; no flags.
    let fd = unsafe { libc::memfd_create(c"chunks".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: our descriptor.
    assert_eq!(unsafe { libc::ftruncate(fd, file_len as i64) }, 0);
    (fd, map(fd, len))
}

fn map(fd: i32, len: usize) -> *mut u8 {
    // SAFETY: a fresh shared mapping of our memfd.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

fn push(shm: &Shm, slot: u32, tsc: u64) {
    let p = shm.producer(slot).unwrap();
    let mut limit = 0;
    let ev = Event {
        tsc,
        probe_id: 1,
        kind: KIND_ENTRY,
        nargs: 2,
        ..Default::default()
    };
    // SAFETY: this test is the ring's only producer.
    assert!(unsafe { p.push(&mut limit, &ev) });
}

#[test]
fn slots_past_the_first_chunk_are_shared_by_every_view_up_to_the_cap() {
    let initial = Layout::new(params()).unwrap().total_size;
    let file_len = growable_file_len(params(), initial, CAP).unwrap();
    let (fd, p) = memfd_mapping(file_len, initial);
    // SAFETY: zero-filled shared mapping of `initial` bytes of the memfd.
    let tracer = unsafe { Shm::create_growable(p, initial, params(), CAP) }.unwrap();
    assert_eq!(tracer.slot_capacity(), CAP);
    assert_eq!(tracer.slot_chunk_size(), N_THREADS);
    // The agent's view: its own mapping of the first part only.
    let q = map(fd, initial);
    // SAFETY: a mapping of the same memory, valid for `initial` bytes.
    let mut agent = unsafe { Shm::attach(q, initial) }.unwrap();
    agent.limit_slots_to_file(file_len);
    assert_eq!(agent.slot_capacity(), CAP);
    assert_eq!(agent.chunks_mapped(), 0);

    let slots: Vec<u32> = (0..CAP)
        .map(|i| {
            agent
                .claim_thread_for(7, 100 + i)
                .expect("a slot up to the cap")
        })
        .collect();
    assert_eq!(slots, (0..CAP).collect::<Vec<_>>());
    assert_eq!(agent.claim_thread_for(7, 999), None, "the cap is a cap");
    // Chunks 1 and 2 (slots 4..8, 8..10) mapped by the agent's claims.
    assert_eq!(agent.chunks_mapped(), 2);
    for s in 0..CAP {
        agent.thread_counters(s).unwrap()[2].store(1000 + u64::from(s), Relaxed);
        push(&agent, s, u64::from(s) * 10);
    }
    // The tracer's view maps the chunks as it reads them.
    assert_eq!(tracer.chunks_mapped(), 0);
    assert_eq!(tracer.threads_in_use(), CAP);
    assert_eq!(tracer.counter(2), (0..CAP as u64).map(|s| 1000 + s).sum());
    assert_eq!(tracer.chunks_mapped(), 2);
    for s in 0..CAP {
        assert_eq!(tracer.thread_owner(s), Some((7, 100 + s)));
        let mut got = Vec::new();
        tracer
            .consumer(s)
            .unwrap()
            .drain(|e| got.push(e.tsc))
            .unwrap();
        assert_eq!(got, vec![u64::from(s) * 10], "slot {s}");
    }
    // A slot of chunk 2 given back is claimed again, by the same process.
    agent.release_thread(9);
    assert_eq!(agent.claim_thread_for(7, 555), Some(9));
    assert_eq!(tracer.thread_owner(9), Some((7, 555)));
    // The whole file mapped at once: the view still maps chunks apart.
    let r = map(fd, file_len);
    // SAFETY: valid for `file_len` bytes.
    let whole = unsafe { Shm::attach(r, file_len) }.unwrap();
    assert_eq!(whole.len(), initial);
    assert_eq!(whole.counter(2), tracer.counter(2));
    drop((agent, tracer, whole));
    // SAFETY: our mappings and descriptor; no view left.
    unsafe {
        libc::munmap(p.cast(), initial);
        libc::munmap(q.cast(), initial);
        libc::munmap(r.cast(), file_len);
        libc::close(fd);
    }
}

/// A file shorter than the directory says (a truncated memfd): the agent
/// lowers the cap to the chunks the file holds.
#[test]
fn the_cap_shrinks_to_the_chunks_the_file_holds() {
    let initial = Layout::new(params()).unwrap().total_size;
    let file_len = growable_file_len(params(), initial, CAP).unwrap();
    let (fd, p) = memfd_mapping(file_len, initial);
    // SAFETY: zero-filled shared mapping of `initial` bytes of the memfd.
    let mut shm = unsafe { Shm::create_growable(p, initial, params(), CAP) }.unwrap();
    let chunk1 = initial.next_multiple_of(PAGE);
    shm.limit_slots_to_file(chunk1 + 10);
    assert_eq!(shm.slot_capacity(), N_THREADS);
    for i in 0..N_THREADS {
        assert_eq!(shm.claim_thread(i + 1), Some(i));
    }
    assert_eq!(shm.claim_thread(99), None);
    drop(shm);
    // SAFETY: our mapping and descriptor.
    unsafe {
        libc::munmap(p.cast(), initial);
        libc::close(fd);
    }
}

/// A directory that contradicts the layout is refused at attach.
#[test]
fn an_inconsistent_directory_is_refused() {
    let initial = Layout::new(params()).unwrap().total_size;
    let file_len = growable_file_len(params(), initial, CAP).unwrap();
    let (fd, p) = memfd_mapping(file_len, initial);
    // SAFETY: zero-filled shared mapping of `initial` bytes of the memfd.
    let shm = unsafe { Shm::create_growable(p, initial, params(), CAP) }.unwrap();
    drop(shm);
    // chunk_bytes (third word of the directory) one page off.
    let w = p.wrapping_add(SLOT_DIRECTORY_OFFSET + 16) as *mut u64;
    // SAFETY: inside the first page of our mapping.
    unsafe { w.write(w.read() + PAGE as u64) };
    // SAFETY: valid for `initial` bytes.
    let refused = unsafe { Shm::attach(p, initial) };
    assert!(matches!(refused, Err(AbiError::Inconsistent(_))));
    // SAFETY: our mapping and descriptor.
    unsafe {
        libc::munmap(p.cast(), initial);
        libc::close(fd);
    }
}

/// Both ways of mapping a chunk: in place after the first part when the
/// addresses after it are free, and as a second mapping (with the page
/// before the chunk) when they are taken; either way the slot's memory is
/// the file's.
#[test]
fn a_chunk_is_mapped_in_place_or_beside_and_is_the_files_either_way() {
    let initial = Layout::new(params()).unwrap().total_size;
    let file_len = growable_file_len(params(), initial, CAP).unwrap();
    let chunk1 = initial.next_multiple_of(PAGE);
    for blocked in [false, true] {
        // SAFETY: a NUL-terminated name; no flags.
        let fd = unsafe { libc::memfd_create(c"chunks".as_ptr(), 0) };
        // SAFETY: our descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd, file_len as i64) }, 0);
        // Room for the whole file, reserved then given back: the first part
        // goes at its start, with free addresses after it (or a page of
        // ours right after it, when `blocked`).
        // SAFETY: a fresh anonymous reservation.
        let room = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                file_len + PAGE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(room, libc::MAP_FAILED);
        // SAFETY: our reservation.
        unsafe { libc::munmap(room, file_len + PAGE) };
        // SAFETY: at the start of the room just given back (ours alone).
        let p = unsafe {
            libc::mmap(
                room,
                initial,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                fd,
                0,
            )
        };
        assert_eq!(p, room);
        let guard = (room as usize + chunk1) as *mut libc::c_void;
        if blocked {
            // SAFETY: inside the room we reserved, right after the first part.
            let g = unsafe {
                libc::mmap(
                    guard,
                    PAGE,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            assert_eq!(g, guard);
        }
        // SAFETY: zero-filled shared mapping of `initial` bytes of the memfd.
        let shm = unsafe { Shm::create_growable(p.cast(), initial, params(), CAP) }.unwrap();
        for i in 0..CAP {
            assert_eq!(shm.claim_thread(i + 1), Some(i));
        }
        let ctl4 = shm.ring_ctl(N_THREADS).unwrap() as *const RingCtl as usize;
        assert_eq!(ctl4 == guard as usize, !blocked, "blocked: {blocked}");
        shm.thread_counters(9).unwrap()[3].store(77, Relaxed);
        // What the file holds at slot 9 (chunk 2, slot 1).
        let stride = Layout::new(params()).unwrap().thread_stride;
        let chunk_bytes = ((stride + std::mem::size_of::<HandlerSlot>()) * N_THREADS as usize)
            .next_multiple_of(PAGE);
        let at = chunk1 + chunk_bytes + stride + THREAD_COUNTERS_OFFSET + 3 * 8;
        let mut word = [0u8; 8];
        // SAFETY: `word` is valid for 8 bytes.
        let n = unsafe { libc::pread(fd, word.as_mut_ptr().cast(), 8, at as i64) };
        assert_eq!(n, 8);
        assert_eq!(u64::from_le_bytes(word), 77);
        drop(shm);
        // SAFETY: our mappings and descriptor; no view left.
        unsafe {
            if blocked {
                libc::munmap(guard, PAGE);
            }
            libc::munmap(p, initial);
            libc::close(fd);
        }
    }
}

/// Handler slots grow with the chunks: past the trap table's 256, one per
/// thread slot of each chunk past the first; claimed, seen by the other
/// view (the tracer serves calls from them), given back and claimed again.
#[test]
fn handler_slots_past_the_trap_tables_live_in_the_chunks() {
    let initial = Layout::new(params()).unwrap().total_size;
    let file_len = growable_file_len(params(), initial, CAP).unwrap();
    let (fd, p) = memfd_mapping(file_len, initial);
    // SAFETY: zero-filled shared mapping of `initial` bytes of the memfd.
    let tracer = unsafe { Shm::create_growable(p, initial, params(), CAP) }.unwrap();
    let q = map(fd, initial);
    // SAFETY: a mapping of the same memory, valid for `initial` bytes.
    let agent = unsafe { Shm::attach(q, initial) }.unwrap();
    // Chunks 1 and 2 (slots 4..10): 2 × 4 handler slots more.
    let cap = HANDLER_SLOTS as u32 + 8;
    assert_eq!(agent.handler_capacity(), cap);
    let mut got = Vec::new();
    for tid in 1..=cap {
        let (i, s) = agent.claim_handler_slot(tid).expect("a handler slot");
        assert_eq!(s.tid.load(Relaxed), tid);
        got.push(i);
    }
    got.sort();
    assert_eq!(got, (0..cap).collect::<Vec<_>>());
    assert_eq!(agent.claim_handler_slot(cap + 1).map(|x| x.0), None);
    assert_eq!(tracer.handler_slots_owned(), cap);
    // The last one, in chunk 2, through the tracer's own mapping of it.
    let last = tracer.handler_slot_at(cap - 1).unwrap();
    assert_ne!(last.tid.load(Relaxed), 0);
    last.state.store(HANDLER_REQUEST, Relaxed);
    let own = agent.handler_slot_at(cap - 1).unwrap();
    assert_eq!(own.state.load(Relaxed), HANDLER_REQUEST);
    own.state.store(HANDLER_IDLE, Relaxed);
    let tid = own.tid.load(Relaxed);
    assert!(agent.handler_slot_of(cap - 1, tid).is_some());
    agent.release_handler_slot(cap - 1, tid);
    assert_eq!(tracer.handler_slots_owned(), cap - 1);
    assert_eq!(agent.claim_handler_slot(9999).map(|x| x.0), Some(cap - 1));
    drop((agent, tracer));
    // SAFETY: our mappings and descriptor; no view left.
    unsafe {
        libc::munmap(p.cast(), initial);
        libc::munmap(q.cast(), initial);
        libc::close(fd);
    }
}
