//! Unit tests of the code ledger (`ledger.rs`).

use super::*;

#[test]
fn sites_stay_sorted_and_found() {
    let mut l = CodeLedger::default();
    l.insert(0x100, &[1, 2, 3, 4, 5], CodeOwner::Fast);
    l.insert(0x200, &[9], CodeOwner::Trap);
    l.insert(0x180, &[7], CodeOwner::InProcess);
    let starts: Vec<u64> = l.sites().iter().map(|s| s.start).collect();
    assert_eq!(starts, [0x100, 0x180, 0x200]);
    assert_eq!(l.site_at(0x103).map(|s| s.start), Some(0x100));
    assert_eq!(l.site_at(0x105).map(|s| s.start), None);
    assert_eq!(
        l.site_at(0x180).map(|s| s.owner),
        Some(CodeOwner::InProcess)
    );
    assert_eq!(l.first_start_in(0x101, 0x181), Some(0x180));
    assert_eq!(l.first_start_in(0x101, 0x180), None);
    assert_eq!(
        l.originals_in(0x102, 0x104),
        vec![(0x100, vec![1, 2, 3, 4, 5])]
    );
    l.remove(0x180, CodeOwner::InProcess);
    assert_eq!(l.site_at(0x180).map(|s| s.start), None);
}

#[test]
fn a_second_write_keeps_the_files_bytes() {
    let mut l = CodeLedger::default();
    l.insert(0x100, &[1, 2], CodeOwner::Fast);
    l.insert(0x100, &[0xe8, 0, 0], CodeOwner::Fast);
    assert_eq!(l.sites().len(), 1);
    assert_eq!(l.sites()[0].original(), &[1, 2, 0]);
}

#[test]
fn fast_site_probes_join_and_leave() {
    let mut l = CodeLedger::default();
    l.insert(0x100, &[1, 2, 3, 4, 5], CodeOwner::Fast);
    l.add_probe(0x100, (ProbeId(1), false));
    l.add_probe(0x100, (ProbeId(2), true));
    l.drop_probe(ProbeId(1));
    assert_eq!(
        l.fast_site(0x100).unwrap().probes().collect::<Vec<_>>(),
        [(ProbeId(2), true)]
    );
    l.drop_probe(ProbeId(2));
    assert!(l.fast_site(0x100).is_none());
}

/// A ledger of every kind of site: an `int3` and its guard, an
/// in-process trap, a jump with a probe, a probe's empty entry.
fn every_kind() -> CodeLedger {
    let mut l = CodeLedger::default();
    l.sync_traps(
        Some(vec![0x10, 0x11]),
        Vec::new,
        |a| Some(a as u8),
        |a| a == 0x11,
    );
    l.insert(0x20, &[0x55], CodeOwner::InProcess);
    l.insert(0x30, &[1, 2, 3, 4, 5], CodeOwner::Fast);
    l.add_probe(0x30, (ProbeId(1), false));
    l.add_probe(0x40, (ProbeId(2), false));
    l
}

#[test]
fn an_unfollowed_fork_child_gets_every_original_back_in_one_walk() {
    let l = every_kind();
    // The int3 at 0x11 is lifted for a step: the child's copy holds
    // the original there; the one at 0x10 had its byte rewritten.
    let under = |a: u64| (a == 0x10).then_some(0x90);
    let w = l.fork_walk(false, under);
    assert_eq!(
        w.put_back,
        vec![
            (0x10, vec![0x90]),
            (0x20, vec![0x55]),
            (0x30, vec![1, 2, 3, 4, 5])
        ]
    );
    assert!(w.kept.is_empty());
}

#[test]
fn a_followed_fork_child_keeps_the_agents_writes_as_inherited() {
    let l = every_kind();
    let w = l.fork_walk(true, |a| Some(a as u8));
    assert_eq!(w.put_back, vec![(0x10, vec![0x10]), (0x11, vec![0x11])]);
    assert_eq!(
        w.kept,
        vec![(0x20, vec![0x55]), (0x30, vec![1, 2, 3, 4, 5])]
    );
    // The child's ledger: what it inherited, with the bytes written.
    let mut child = CodeLedger::default();
    child.insert_inherited(0x30, &[1, 2, 3, 4, 5], &[0xe9, 9, 9, 9, 9]);
    child.insert_inherited(0x20, &[0x55], &[0xcc]);
    // Nothing when the bytes do not pair up.
    child.insert_inherited(0x50, &[1, 2], &[3]);
    let sites: Vec<String> = child
        .sites()
        .iter()
        .map(|s| {
            let w = s.written().unwrap_or_default();
            format!("{:#x} {:?} {:x?} {:x?}", s.start, s.owner, s.original(), w)
        })
        .collect();
    assert_eq!(
        sites,
        [
            "0x20 Inherited [55] [cc]",
            "0x30 Inherited [1, 2, 3, 4, 5] [e9, 9, 9, 9, 9]",
        ]
    );
    assert_eq!(child.site_at(0x33).map(|s| s.end()), Some(0x35));
    // A grandchild not followed gets them back too; followed, keeps them.
    let w = child.fork_walk(false, |_| None);
    assert_eq!(
        w.put_back,
        vec![(0x20, vec![0x55]), (0x30, vec![1, 2, 3, 4, 5])]
    );
    assert_eq!(child.fork_walk(true, |_| None).kept.len(), 2);
    // An exec forgets them with the rest of the image.
    child.forget_image();
    assert!(child.sites().is_empty());
}

#[test]
fn sites_no_mapping_holds_are_taken_out_by_gap_in_one_walk() {
    let mut l = CodeLedger::default();
    for a in [0x1010, 0x2010, 0x2020, 0x3010, 0x5000] {
        l.insert(a, &[1], CodeOwner::Trap);
    }
    // A trap's guard is no probe site of its own.
    l.insert(0x2021, &[1], CodeOwner::Guard);
    // A jump serving two probes.
    l.insert(0x2030, &[1, 2, 3, 4, 5], CodeOwner::Fast);
    l.add_probe(0x2030, (ProbeId(7), false));
    l.add_probe(0x2030, (ProbeId(8), true));
    // 0x2000..0x3000 was unmapped; 0x5000 lies past every mapping.
    let mapped = [(0x1000, 0x2000), (0x3000, 0x4000)];
    let gaps = l.unmapped_walk_summary(&mapped);
    assert_eq!(
        gaps,
        [
            (0x2000, 0x3000, vec![0x2010, 0x2020, 0x2021, 0x2030], 3),
            (0x4000, u64::MAX, vec![0x5000], 1)
        ]
    );
    // Taken out: the sites still mapped stay, nothing else.
    let left: Vec<u64> = l.sites().iter().map(|s| s.start).collect();
    assert_eq!(left, [0x1010, 0x3010]);
    assert!(l.take_unmapped(&mapped).is_empty());
}

#[test]
fn the_walk_hands_back_the_probes_a_fast_site_served() {
    let mut l = CodeLedger::default();
    l.insert(0x2030, &[1, 2, 3, 4, 5], CodeOwner::Fast);
    l.add_probe(0x2030, (ProbeId(7), false));
    l.add_probe(0x2030, (ProbeId(8), true));
    l.insert(0x2040, &[0x55], CodeOwner::InProcess);
    let gaps = l.take_unmapped(&[(0x1000, 0x2000)]);
    assert_eq!(gaps.len(), 1);
    let sites = &gaps[0].sites;
    assert_eq!(sites[0].probes, [ProbeId(7), ProbeId(8)]);
    assert_eq!(sites[1].owner, CodeOwner::InProcess);
    assert!(sites[1].probes.is_empty());
    assert!(l.sites().is_empty());
}

#[test]
fn trap_changes_are_taken_in_and_handed_on() {
    let mut l = CodeLedger::default();
    l.sync_traps(
        Some(vec![0x10, 0x11]),
        Vec::new,
        |a| Some(a as u8),
        |a| a == 0x11,
    );
    assert_eq!(l.sites()[1].owner, CodeOwner::Guard);
    // A new ledger has its trap mechanism look at every int3 first.
    assert_eq!(l.take_trap_changes(), None);
    l.sync_traps(Some(vec![0x11]), Vec::new, |_| None, |_| false);
    assert_eq!(l.traps().collect::<Vec<_>>(), [0x10]);
    assert_eq!(l.take_trap_changes(), Some(vec![0x11]));
    l.sync_traps(None, || vec![(0x20, 1)], |_| None, |_| false);
    assert_eq!(l.traps().collect::<Vec<_>>(), [0x20]);
    assert_eq!(l.take_trap_changes(), None);
    assert_eq!(l.take_trap_changes(), Some(vec![]));
}
