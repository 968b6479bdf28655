//! Unit tests of `cond.rs`: parsing, evaluation, limits.

use super::*;

#[test]
fn parses_and_evaluates() {
    let c = Cond::parse("arg0 > 5").unwrap();
    assert!(c.eval(&[6]));
    assert!(!c.eval(&[5]));
    assert!(!c.eval(&[u64::MAX]), "signed: -1 < 5");
    assert!(!c.eval(&[]), "missing argument");
    let c = Cond::parse("(arg0>=2 && arg1 != 0x10) || !(arg2 < -1)").unwrap();
    assert_eq!(c.args_needed(), 3);
    assert!(c.eval(&[2, 0, -5i64 as u64]));
    assert!(!c.eval(&[1, 0, -5i64 as u64]));
    assert!(c.eval(&[1, 0, 0]));
    assert!(Cond::parse("arg1 == -9223372036854775808").is_ok());
    assert!(Cond::parse("1 < arg5").unwrap().eval(&[0, 0, 0, 0, 0, 2]));
}

#[test]
fn typed_errors() {
    use CondError::*;
    assert_eq!(
        Cond::parse("arg0 >"),
        Err(End {
            pos: 7,
            expected: "an argument (arg0 to arg5) or a number"
        })
    );
    assert_eq!(Cond::parse("arg6 == 1"), Err(NoSuchArg { pos: 1, n: 6 }));
    assert_eq!(
        Cond::parse("x == 1"),
        Err(UnknownName {
            pos: 1,
            name: "x".into()
        })
    );
    assert!(matches!(
        Cond::parse("arg0 = 1"),
        Err(Unexpected { pos: 6, .. })
    ));
    assert!(matches!(
        Cond::parse("arg0 == 99999999999999999999"),
        Err(BadNumber { pos: 9, .. })
    ));
    assert!(matches!(Cond::parse("(arg0 == 1"), Err(End { .. })));
    assert!(matches!(
        Cond::parse("arg0 == 1 arg1"),
        Err(Unexpected { pos: 11, .. })
    ));
    assert!(matches!(Cond::parse("arg0 == 1 $"), Err(Unexpected { .. })));
    let e = Cond::parse("arg0 >").unwrap_err().to_string();
    assert!(e.starts_with("column 7: expected an argument"), "{e}");
}

#[test]
fn deep_and_long_conditions_are_refused() {
    let ok = format!(
        "{}arg0 == 1{}",
        "(".repeat(MAX_DEPTH),
        ")".repeat(MAX_DEPTH)
    );
    assert!(Cond::parse(&ok).unwrap().eval(&[1]));
    let deep = format!("{}arg0 == 1{}", "(".repeat(20_000), ")".repeat(20_000));
    assert_eq!(
        Cond::parse(&deep),
        Err(CondError::TooDeep {
            pos: MAX_DEPTH + 1,
            limit: MAX_DEPTH
        })
    );
    let nots = format!("{}arg0 == 1", "!".repeat(20_000));
    assert!(matches!(Cond::parse(&nots), Err(CondError::TooDeep { .. })));
    let long = vec!["arg0 == 1"; 100_000].join(" && ");
    assert!(matches!(
        Cond::parse(&long),
        Err(CondError::TooLong {
            limit: MAX_TERMS,
            ..
        })
    ));
    let fits = vec!["arg0 == 1"; MAX_TERMS].join(" || ");
    assert!(Cond::parse(&fits).unwrap().eval(&[1]));
    assert_eq!(
        Cond::parse(&deep).unwrap_err().to_string(),
        "column 65: the condition nests deeper than 64 levels (parentheses and `!`)"
    );
}

#[test]
fn names_are_parameters_or_syntax_errors() {
    assert_eq!(Cond::names_parameters("arg0 > 1"), Ok(false));
    assert_eq!(Cond::names_parameters("n > 1 && arg1 == 0"), Ok(true));
    assert!(matches!(
        Cond::names_parameters("n > 1 &&"),
        Err(CondError::End { .. })
    ));
    assert!(matches!(
        Cond::names_parameters("arg7 > n"),
        Err(CondError::NoSuchArg { n: 7, .. })
    ));
}

#[test]
fn specs() {
    assert_eq!(split_spec("leaf"), ("leaf", None));
    assert_eq!(split_spec("leaf if arg0 > 2"), ("leaf", Some("arg0 > 2")));
    assert_eq!(
        split_spec("lib.so:f if  arg1==0"),
        ("lib.so:f", Some("arg1==0"))
    );
    assert_eq!(split_spec("iffy"), ("iffy", None));
}
