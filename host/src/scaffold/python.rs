//! A processor project in Python: `pip install -r requirements.txt` (the
//! SDK and componentize-py), then `python -m streamhost_guest build`.

use super::{readme_after_build, Sdk, EXPECTED, SAMPLE};

/// The files of a new Python project.
pub(super) fn files(name: &str, sdk: &Sdk) -> Vec<(&'static str, String)> {
    let requirement = match sdk {
        Sdk::Path(p) => format!("streamhost-guest @ file://{}", p.display()),
        Sdk::Git(url) => format!(
            "streamhost-guest @ git+{}#subdirectory=guest-sdk/python",
            url.trim_start_matches("git+")
        ),
    };
    let requirements = format!("# The SDK (it brings componentize-py, pinned).\n{requirement}\n");
    let processor = format!(
        r#""""The {name} processor: folds its stream into a state.

The state is stored as JSON after every batch and handed back to the next
one; `fold` sees one event at a time, in offset order. Keep it
deterministic: the same events must give the same state.

Keep the JSON state small: it travels whole on every wake. Per-entity data
(a balance per account, a record per order) belongs in keyed state, which
a wake reads and writes key by key and which commits with the state::

    from streamhost_guest.keyed import KeyedMap
    totals = KeyedMap("total/")
    totals.set(customer, (totals.get(customer) or 0) + amount)
"""

from streamhost_guest import Failure, define_processor


def fold(state, event, ctx):
    state["events"] += 1
    state["by_type"][event.type] = state["by_type"].get(event.type, 0) + 1
    amount = event.payload.get("amount") if isinstance(event.payload, dict) else None
    if amount is not None:
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise Failure.fatal(f"payload.amount of the event at offset {{event.offset}} is not a number: {{amount!r}}")
        state["total"] += amount
    state["last_offset"] = event.offset


Processor = define_processor(
    slug="{name}",
    version="0.1.0",
    # Event types to fold; empty means every type but the platform's own
    # (`events.iterate.com/...`; set platform_events=True for those).
    consumes=[],
    initial_state=lambda: {{"events": 0, "by_type": {{}}, "total": 0, "last_offset": 0}},
    fold=fold,
)
"#
    );
    let after_build = readme_after_build(
        name,
        &format!("streamhost test {name}.wasm --events events.jsonl --expect expected.json"),
        "",
    );
    let readme = format!(
        r#"# {name}

A streamhost processor in Python: `processor.py` folds a stream's events
into a state (events by type, the sum of `payload.amount`). It is built
with componentize-py through the SDK (`streamhost-guest`).

Install once (Python 3.11 or later), in a virtual environment:

```sh
python3 -m venv .venv
. .venv/bin/activate
pip install -r requirements.txt
```

Build:

```sh
python -m streamhost_guest build processor -o {name}.wasm
```

{after_build}
An exception halts the processor: the exception, the line that raised it
and its traceback are the failure's message. `Failure.retry(message)` is
retried with backoff instead.
"#
    );
    vec![
        ("requirements.txt", requirements),
        ("processor.py", processor),
        ("events.jsonl", SAMPLE.to_string()),
        ("expected.json", EXPECTED.to_string()),
        ("README.md", readme),
        (".gitignore", "/.venv\n/*.wasm\n__pycache__/\n".to_string()),
    ]
}
