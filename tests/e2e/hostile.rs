//! Hostile guests are contained: each misbehaviour ends in a durable halt
//! (after retries, or at once when retrying cannot help), and the host keeps
//! serving other streams.

use std::time::Duration;

use serde_json::{json, Value};

use crate::processors::PROC;
use crate::support::{guest, Server};

/// A server with the hostile guest deployed and woken (subscription "h")
/// by the stream at `path`; returns the server and the stream's API path.
async fn hostile_on(path: &str) -> (Server, String) {
    let s = Server::start_with(Some(PROC), &[]);
    let (status, out) = s.deploy("acme", "hostile", guest("hostile")).await;
    assert_eq!(status, 200, "{out}");
    let stream = format!("/v1/projects/acme/streams{path}");
    s.post(
        &format!("{stream}:append"),
        json!({"events": [{"type": "events.iterate.com/stream/subscription-configured",
            "payload": {"subscriptionKey": "h", "receiver": {"action": "processor-wake",
                "expression": ["components", ["get", "hostile"], "wake"]}}}]}),
    )
    .await;
    (s, stream)
}

async fn halted_with(kind: &str) -> (Value, Value) {
    let (s, stream) = hostile_on(&format!("/{kind}")).await;
    s.post(
        &format!("{stream}:append"),
        json!({"events": [{"type": format!("hostile/{kind}")}]}),
    )
    .await;
    let halted = s.wait_halted(&stream, "h", Duration::from_secs(60)).await;
    // The host still serves other streams.
    let (status, _) = s
        .post(
            "/v1/projects/acme/streams/other:append",
            json!({"events": [{"type": "x.y/a"}]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(s.get("/healthz").await.0, 200);
    let (_, p) = s.get(&format!("{stream}:processors/hostile")).await;
    (halted, p)
}

fn error(halted: &Value) -> &str {
    halted["error"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn a_guest_that_loops_forever_times_out() {
    if crate::support::skipped_on_postgres(
        "a guest's deadline is the runtime's, the same on either storage (other halts are recorded on both)",
    ) {
        return;
    }
    let (halted, p) = halted_with("loop").await;
    assert!(
        error(&halted).contains("timed out after 1000ms"),
        "{halted}"
    );
    assert_eq!(halted["attempts"], 3);
    assert_eq!(p["status"], "halted");
}

#[tokio::test]
async fn a_guest_that_grows_memory_without_bound_traps() {
    let (s, stream) = hostile_on("/grow").await;
    let (status, out) = s
        .post(
            &format!("{stream}:append"),
            json!({"events": [{"type": "hostile/grow"}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let halted = s.wait_halted(&stream, "h", Duration::from_secs(60)).await;
    assert!(error(&halted).contains("the guest trapped"), "{halted}");
    // It grew to the 256 MiB a guest may have, and no further: the largest
    // instance /metrics reports.
    let largest = s.metric("streamhost_guest_memory_max_bytes ").await;
    assert!(
        (250 << 20..=(256 << 20) + (1 << 20)).contains(&largest),
        "largest guest memory {largest} bytes"
    );
    assert_eq!(s.get("/healthz").await.0, 200);
}

#[tokio::test]
async fn a_guest_that_overflows_its_stack_traps() {
    let (halted, _) = halted_with("stack").await;
    assert!(error(&halted).contains("the guest trapped"), "{halted}");
}

#[tokio::test]
async fn a_guest_that_traps_halts_with_a_wasmtime_repro_command() {
    let (halted, p) = halted_with("trap").await;
    let e = error(&halted);
    assert!(e.contains("the guest trapped"), "{halted}");
    // The halt fact stays small: the repro (the whole state and batch) is
    // the processor's last failure.
    assert!(!e.contains("wasmtime run"), "{halted}");
    assert!(e.contains("lastFailure"), "{halted}");
    let failure = &p["lastFailure"];
    assert!(
        failure["message"]
            .as_str()
            .unwrap()
            .contains("the guest trapped"),
        "{p}"
    );
    assert_eq!(failure["offset"], 3, "{p}");
    let command = failure["repro"].as_str().expect("a repro command");
    assert!(
        command.starts_with("wasmtime run --invoke 'fold("),
        "{command}"
    );
    assert_valid_wave_fold_call(command);
}

#[tokio::test]
async fn a_halt_fact_stays_small_while_last_failure_keeps_the_whole_repro() {
    // The repro quotes the state and the batch: with a 64 KiB payload it is
    // far larger than a fact may be (4 KiB).
    let (s, stream) = hostile_on("/big").await;
    let stream = stream.as_str();
    let (status, out) = s
        .post(
            &format!("{stream}:append"),
            json!({"events": [{"type": "hostile/trap", "payload": {"blob": "x".repeat(64 * 1024)}}]}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let halted = &s.wait_halted(stream, "h", Duration::from_secs(60)).await;
    assert!(error(halted).len() <= 4096, "{}", error(halted).len());
    let (_, p) = s.get(&format!("{stream}:processors/hostile")).await;
    let repro = p["lastFailure"]["repro"].as_str().expect("a repro");
    assert!(
        repro.len() > 64 * 1024,
        "the repro is whole: {}",
        repro.len()
    );
}

/// Parses the `--invoke` argument of a repro command as WAVE against the
/// `fold` function type of the real component and makes the call, as the
/// wasmtime CLI does (`wasmtime run --invoke`: WASI linked, the arguments
/// parsed against the export's parameter types, one dynamic call): the
/// command reproduces the failure if the call traps.
pub fn assert_valid_wave_fold_call(command: &str) {
    use wasmtime::component::types::ComponentItem;
    use wasmtime::component::wasm_wave::untyped::UntypedFuncCall;
    use wasmtime::component::{Component, Type, Val};

    let quoted = command
        .strip_prefix("wasmtime run --invoke '")
        .and_then(|r| r.rsplit_once("' "))
        .map(|(call, _file)| call.replace("'\\''", "'"))
        .expect("an --invoke argument in single quotes");
    let engine = wasmtime::Engine::default();
    let component = Component::new(&engine, guest("hostile")).unwrap();
    let ty = component.component_type();
    let fold = ty
        .exports(&engine)
        .find_map(|(name, item)| match item.ty {
            ComponentItem::ComponentInstance(i)
                if name.starts_with("streamhost:processor/processor") =>
            {
                i.exports(&engine).find_map(|(f, item)| match item.ty {
                    ComponentItem::ComponentFunc(func) if f == "fold" => Some(func),
                    _ => None,
                })
            }
            _ => None,
        })
        .expect("the component exports fold");
    let params: Vec<Type> = fold.params().map(|(_, t)| t).collect();
    let call =
        UntypedFuncCall::parse(&quoted).unwrap_or_else(|e| panic!("not WAVE: {e}: {quoted}"));
    assert_eq!(call.name(), "fold");
    let values: Vec<Val> = call
        .to_wasm_params(params.iter())
        .unwrap_or_else(|e| panic!("WAVE does not fit fold's parameters: {e}: {quoted}"));
    assert_eq!(values.len(), 2);

    struct Cli {
        wasi: wasmtime_wasi::WasiCtx,
        table: wasmtime::component::ResourceTable,
    }
    impl wasmtime_wasi::WasiView for Cli {
        fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
            wasmtime_wasi::WasiCtxView {
                ctx: &mut self.wasi,
                table: &mut self.table,
            }
        }
    }
    // On a thread of its own, as the CLI runs it: WASI's sync bindings must
    // not run inside the test's async runtime.
    let outcome = std::thread::spawn(move || {
        let mut linker = wasmtime::component::Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).unwrap();
        let mut store = wasmtime::Store::new(
            &engine,
            Cli {
                wasi: wasmtime_wasi::WasiCtx::builder().build(),
                table: wasmtime::component::ResourceTable::new(),
            },
        );
        let instance = linker.instantiate(&mut store, &component).unwrap();
        let interface = component
            .get_export_index(None, "streamhost:processor/processor@0.3.0")
            .expect("the processor interface");
        let index = component
            .get_export_index(Some(&interface), "fold")
            .expect("fold");
        let func = instance.get_func(&mut store, index).expect("fold");
        let mut results = vec![Val::Bool(false)];
        let outcome = func.call(&mut store, &values, &mut results);
        outcome.map(|()| results)
    })
    .join()
    .expect("the call's thread");
    let trap = outcome.expect_err("the repro call traps as the fold did");
    assert!(
        trap.downcast_ref::<wasmtime::Trap>().is_some(),
        "a wasm trap, not a host error: {trap:#}"
    );
}

#[tokio::test]
async fn invalid_json_state_halts_at_once() {
    let (halted, _) = halted_with("invalid-json").await;
    assert!(
        error(&halted).contains("returned a state that is not JSON"),
        "{halted}"
    );
    assert_eq!(halted["attempts"], 1, "retrying cannot help");
}

#[tokio::test]
async fn a_100_mb_state_halts_at_once() {
    let (halted, _) = halted_with("huge").await;
    assert!(
        error(&halted).contains("over the 16777216-byte limit"),
        "{halted}"
    );
    assert_eq!(halted["attempts"], 1);
}
