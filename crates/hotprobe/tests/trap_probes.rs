//! The trap mechanism with Kprobes semantics on real gcc-compiled programs.

mod support;

use hotprobe::{Probe, RetProbe, RunEnd};
use std::cell::RefCell;
use std::rc::Rc;
use support::*;

fn counter() -> (Rc<RefCell<u64>>, impl FnMut(&mut hotprobe::HitContext<'_>) + 'static) {
    let c = Rc::new(RefCell::new(0u64));
    let c2 = c.clone();
    (c, move |_ctx: &mut hotprobe::HitContext<'_>| *c2.borrow_mut() += 1)
}

#[test]
fn counts_a_function_in_a_pie_o2_binary() {
    let bin = program("target", &["-O2", "-pie", "-fPIE"]);
    let mut t = spawn(&bin, &["compute", "100"]);
    let (seen, f) = counter();
    let id = t.session.probe(t.target, "compute", Probe::new().pre(f)).unwrap();
    assert_eq!(t.session.execution_of(id), Some("boosted"), "the entry of compute is boosted");
    t.session.start().unwrap();
    assert_eq!(t.session.run().unwrap(), RunEnd::AllExited);
    let out = t.output();
    assert_eq!(lines_with(&out, "compute(").len(), 100, "{out}");
    assert_eq!(*seen.borrow(), 100);
    assert_eq!(t.session.stats(id).unwrap().hits, 100);
}
