//! Bearer tokens: project tokens, admin tokens, open mode.

use serde_json::json;

use crate::support::{assert_error, Server, TOKENS};

#[tokio::test]
async fn tokens_grant_their_projects_and_admin_everything() {
    let s = Server::start_with(Some(TOKENS), &[]);
    let ev = json!({"events": [{"type": "x.y/a"}]});
    let acme = "/v1/projects/acme/streams/s";

    assert_error(
        &s.post_as(None, &format!("{acme}:append"), ev.clone()).await,
        401,
        "unauthorized",
        "Authorization",
    );
    assert_error(
        &s.post_as(Some("wrong"), &format!("{acme}:append"), ev.clone())
            .await,
        401,
        "unauthorized",
        "unknown token",
    );
    assert_eq!(
        s.post_as(Some("t-acme"), &format!("{acme}:append"), ev.clone())
            .await
            .0,
        200
    );
    assert_eq!(
        s.get_as(Some("t-acme"), &format!("{acme}:state")).await.0,
        200
    );
    assert_error(
        &s.post_as(
            Some("t-acme"),
            "/v1/projects/other/streams/s:append",
            ev.clone(),
        )
        .await,
        403,
        "forbidden",
        "\"other\"",
    );
    assert_error(
        &s.get_as(Some("t-acme"), "/v1/global/streams/s:state").await,
        403,
        "forbidden",
        "global",
    );
    assert_eq!(
        s.post_as(Some("t-admin"), "/v1/global/streams/s:append", ev.clone())
            .await
            .0,
        200
    );
    assert_eq!(
        s.post_as(Some("t-admin"), "/v1/projects/other/streams/s:append", ev)
            .await
            .0,
        200
    );

    // Health needs no token; metrics need an admin token.
    assert_eq!(s.get_as(None, "/healthz").await.0, 200);
    assert_error(
        &s.get_as(None, "/metrics").await,
        401,
        "unauthorized",
        "Authorization",
    );
    assert_error(
        &s.get_as(Some("t-acme"), "/metrics").await,
        403,
        "forbidden",
        "admin",
    );
    assert_eq!(s.get_as(Some("t-admin"), "/metrics").await.0, 200);
    // Health's detail names streams of every project: an admin's.
    assert_error(
        &s.get_as(Some("t-acme"), "/healthz?detail=true").await,
        403,
        "forbidden",
        "admin",
    );
    assert_eq!(
        s.get_as(Some("t-admin"), "/healthz?detail=true").await.0,
        200
    );
}

#[tokio::test]
async fn open_mode_warns_and_admits_everyone() {
    let s = Server::start();
    assert_eq!(s.get_as(None, "/metrics").await.0, 200);
    assert_eq!(
        s.post_as(
            None,
            "/v1/global/streams/s:append",
            json!({"events": [{"type": "x.y/a"}]})
        )
        .await
        .0,
        200
    );
    assert!(s.log().contains("no tokens configured"), "{}", s.log());
}
