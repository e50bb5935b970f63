//! Compare-and-append under contention.

use serde_json::json;

use crate::support::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_of_100_concurrent_appends_at_the_same_offset_wins() {
    let s = std::sync::Arc::new(Server::start());
    let stream = "/v1/projects/acme/streams/contended";
    let (_, body) = s
        .post(
            &format!("{stream}:append"),
            json!({"events": [{"type": "x.y/a"}]}),
        )
        .await;
    let next = body["events"][0]["offset"].as_u64().unwrap() + 1;

    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                s.post(
                    &format!("{stream}:append"),
                    json!({"events": [{"type": "x.y/claim", "payload": {"who": i}, "offset": next}]}),
                )
                .await
            })
        })
        .collect();
    let mut wins = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        let (status, body) = t.await.unwrap();
        match status {
            200 => wins.push(body),
            409 => {
                assert_eq!(body["error"]["code"], "offset-conflict", "{body}");
                assert!(body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("expected next offset {next}, found {}", next + 1)));
                conflicts += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(wins.len(), 1, "exactly one append wins");
    assert_eq!(conflicts, 99);
    let events = s.all_events(stream).await;
    assert_eq!(events.len() as u64, next);
    assert_eq!(
        events.last().unwrap()["payload"],
        wins[0]["events"][0]["payload"]
    );
}
