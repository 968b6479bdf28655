//! Unit tests of `typed.rs`: spec splitting, planning errors.

use super::*;

#[test]
fn specs_with_arguments() {
    let (f, e) = split_spec("greet(name, n)").unwrap();
    assert_eq!(f, "greet");
    assert_eq!(
        e.iter().map(|x| x.text.as_str()).collect::<Vec<_>>(),
        ["name", "n"]
    );
    let (f, e) = split_spec("greet name:string p->len").unwrap();
    assert_eq!(f, "greet");
    assert!(e[0].as_string);
    assert_eq!(e[1].path, [(true, "len".to_string())]);
    let (f, e) = split_spec("libc:getpid").unwrap();
    assert_eq!((f.as_str(), e.len()), ("libc:getpid", 0));
    assert!(matches!(split_spec("f(a b)"), Err(TypedError::Dwarf(_))));
    assert!(matches!(split_spec("f p->"), Err(TypedError::Dwarf(_))));
}

#[test]
fn several_errors_one_line_each() {
    let typing = Typing::new(0);
    assert!(typing.check().is_ok());
    for f in ["f", "g"] {
        typing.errors.borrow_mut().push(TypedError::NoDwarf {
            function: f.into(),
            module: "m".into(),
        });
    }
    let e = typing.check().unwrap_err();
    assert!(matches!(&e, TypedError::Several(v) if v.len() == 2));
    assert_eq!(
        e.to_string(),
        "f: no DWARF for it in m (build with -g): argument names need it\n\
         g: no DWARF for it in m (build with -g): argument names need it"
    );
    // Taken by the check: the next one starts afresh.
    assert!(typing.check().is_ok());
}
