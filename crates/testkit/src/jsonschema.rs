//! Validating JSON documents against JSON Schemas (draft 2020-12) with
//! Python's `jsonschema`, which the schemathesis virtualenv already holds.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

const SCRIPT: &str = r#"
import json, sys, uuid
from datetime import datetime
from jsonschema import Draft202012Validator, FormatChecker
schemas_dir, = sys.argv[1:]
# Formats checked, not only annotated: uuid, RFC 3339 date-time (with its
# zone), and the integer widths schemars names.
formats = FormatChecker(formats=())
@formats.checks("uuid", raises=ValueError)
def is_uuid(v):
    return not isinstance(v, str) or str(uuid.UUID(v)) == v.lower()
@formats.checks("date-time", raises=ValueError)
def is_date_time(v):
    return not isinstance(v, str) or ("T" in v.upper() and datetime.fromisoformat(v.replace("z", "Z")).tzinfo is not None)
@formats.checks("int32")
def is_int32(v):
    return not isinstance(v, int) or -2**31 <= v < 2**31
@formats.checks("int64")
def is_int64(v):
    return not isinstance(v, int) or -2**63 <= v < 2**63
@formats.checks("uint32")
def is_uint32(v):
    return not isinstance(v, int) or 0 <= v < 2**32
validators = {}
bad = []
n = 0
for line in sys.stdin:
    doc = json.loads(line)
    t = doc.get("event_type")
    if t not in validators:
        try:
            validators[t] = Draft202012Validator(json.load(open(f"{schemas_dir}/{t}.json")), format_checker=formats)
        except FileNotFoundError:
            bad.append(f"{t}: no schema"); continue
    n += 1
    for e in validators[t].iter_errors(doc):
        bad.append(f"{t} {doc.get('event_id')}: {e.message} at {list(e.path)}")
print(json.dumps({"checked": n, "problems": bad[:50], "problem_count": len(bad)}))
"#;

/// Validates each envelope of `documents` against `<schemas_dir>/<event_type>.json`;
/// returns how many were checked, or the problems found.
pub fn validate_envelopes(schemas_dir: &Path, documents: &[serde_json::Value]) -> anyhow::Result<usize> {
    let python = crate::schemathesis::ensure()?
        .parent()
        .expect("venv/bin")
        .join("python");
    let mut child = Command::new(python)
        .args(["-c", SCRIPT])
        .arg(schemas_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    {
        let mut stdin = child.stdin.take().expect("piped");
        for d in documents {
            writeln!(stdin, "{d}")?;
        }
    }
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "validator failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    anyhow::ensure!(
        report["problem_count"] == 0,
        "{} messages do not match their schema: {}",
        report["problem_count"],
        report["problems"]
    );
    Ok(report["checked"].as_u64().unwrap_or(0) as usize)
}
