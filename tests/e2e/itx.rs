//! Direct ITX calls to exported WIT functions of a real component, with
//! every WIT type kind mapped from JSON and back.

use serde_json::{json, Value};

use crate::support::{assert_error, guest, Server};

async fn deployed() -> Server {
    let s = Server::start();
    let (status, out) = s.deploy("acme", "kinds", guest("kinds")).await;
    assert_eq!(status, 200, "{out}");
    s
}

fn call(function: &str, args: Value) -> Value {
    json!({"expression": ["components", ["get", "kinds"], function], "args": args})
}

fn everything() -> Value {
    json!({
        "flag": true, "tiny": -128, "small": 255, "short": -32768, "ushort": 65535,
        "int": -2147483648i64, "uint": 4294967295u64, "big": 18446744073709551615u64,
        "neg": -9223372036854775808i64, "ratio": 1.5, "precise": "-Infinity", "letter": "ß",
        "name": "héllo \"wave\"", "items": [1, 2, 3], "pair": ["p", 7],
        "point": {"x": -1, "y": 2, "labelText": "origin"}, "color": "green",
        "shape": {"circle": 2.5}, "maybe": null, "outcome": {"err": "nope"}, "perms": ["read", "exec"]
    })
}

#[tokio::test]
async fn every_wit_type_kind_round_trips() {
    let s = deployed().await;
    let (status, out) = s
        .post(
            "/v1/projects/acme/itx",
            call("echo-everything", json!([everything()])),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["result"], everything());
    // camelCase method names, kebab-case record fields on input, other cases.
    let mut kebab = everything();
    let point = kebab["point"].as_object_mut().unwrap();
    let label = point.remove("labelText").unwrap();
    point.insert("label-text".into(), label);
    kebab["shape"] = json!({"nothing": null});
    kebab["maybe"] = json!("some");
    kebab["outcome"] = json!({"ok": 3});
    kebab["precise"] = json!("NaN");
    let (status, out) = s
        .post(
            "/v1/projects/acme/itx",
            call("echoEverything", json!([kebab])),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["result"]["point"]["labelText"], "origin");
    assert_eq!(out["result"]["shape"], json!({"nothing": null}));
    assert_eq!(out["result"]["maybe"], "some");
    assert_eq!(out["result"]["outcome"], json!({"ok": 3}));
    assert_eq!(out["result"]["precise"], "NaN");
    assert_eq!(
        s.post("/v1/projects/acme/itx", call("add", json!([2, 3])))
            .await,
        (200, json!({"result": 5}))
    );
    assert_eq!(
        s.post("/v1/projects/acme/itx", call("divide", json!([5, 2])))
            .await,
        (200, json!({"result": 2.5}))
    );
}

#[tokio::test]
async fn errors_name_the_argument_path_and_expected_type() {
    let s = deployed().await;
    let itx = "/v1/projects/acme/itx";
    let mut bad_point = everything();
    bad_point["point"]["x"] = json!("one");
    let mut bad_small = everything();
    bad_small["small"] = json!(256);
    let mut bad_enum = everything();
    bad_enum["color"] = json!("purple");
    let mut bad_flag = everything();
    bad_flag["perms"] = json!(["fly"]);
    let mut extra = everything();
    extra["extra"] = json!(1);
    let mut missing = everything();
    missing.as_object_mut().unwrap().remove("name");
    for (arg, mention) in [
        (bad_point, "args[0].point.x: expected an integer (s32)"),
        (
            bad_small,
            "args[0].small: expected an integer in the range of u8",
        ),
        (
            bad_enum,
            "args[0].color: expected enum (red | green | blue)",
        ),
        (bad_flag, "args[0].perms[0]"),
        (extra, "args[0].extra: unknown field"),
        (missing, "args[0].name: missing field of type string"),
    ] {
        assert_error(
            &s.post(itx, call("echo-everything", json!([arg]))).await,
            400,
            "invalid-argument",
            mention,
        );
    }
    assert_error(
        &s.post(itx, call("add", json!([1]))).await,
        400,
        "invalid-argument",
        "takes 2 argument(s), got 1",
    );
    assert_error(
        &s.post(itx, call("nope", json!([]))).await,
        404,
        "function-not-found",
        "\"nope\"",
    );
    assert_error(
        &s.post(
            itx,
            json!({"expression": ["components", ["get", "ghost"], "add"], "args": [1, 2]}),
        )
        .await,
        404,
        "component-not-found",
        "\"ghost\"",
    );
    assert_error(
        &s.post(itx, json!({"expression": ["workers", "add"], "args": []}))
            .await,
        400,
        "invalid-expression",
        "unknown root property \"workers\"",
    );
    assert_error(
        &s.post(itx, json!({"expression": ["components", "__proto__", "x"]}))
            .await,
        400,
        "invalid-expression",
        "__proto__",
    );
    assert_error(
        &s.post(itx, json!({"expression": ["components", ["get", "kinds"]]}))
            .await,
        400,
        "invalid-expression",
        "property step",
    );
    assert_error(
        &s.post(itx, call("divide", json!([1, 0]))).await,
        422,
        "itx-failed",
        "cannot divide 1 by zero",
    );
    assert_error(
        &s.post(itx, call("boom", json!([]))).await,
        422,
        "itx-failed",
        "trapped",
    );
    // The host keeps serving.
    assert_eq!(s.post(itx, call("add", json!([1, 1]))).await.1["result"], 2);
}
