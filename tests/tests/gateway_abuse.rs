//! The gateway binary under abuse, judged from outside: sockets that never
//! finish a request (with the descriptor limit lowered), unauthenticated
//! bodies in bulk (the process's peak memory), forged retry reasons
//! (`/metrics` series), install-link floods (`oauth_states` rows and 429s)
//! and a hostile workspace name (the page Slack's OAuth flow ends on).

use std::time::{Duration, Instant};

use axum::body::Bytes;
use futures::future::join_all;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::json;
use threadline_testkit::slack::{TEST_SECRET, app_mention, deliver, now_unix, seed_installation};
use threadline_testkit::{TestDb, bin_path, nats_url, unique_prefix};
use threadline_tests::{
    Proc, free_port, sim_ctl, spawn_gateway, spawn_service_at, spawn_slack_sim,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const APP: &str = "A0ABUSE";
const TEAM: &str = "T0ABUSE";

fn base_env(db: &TestDb) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", db.url.clone()),
        ("NATS_URL", nats_url()),
        ("THREADLINE_BUS_PREFIX", unique_prefix()),
        ("SLACK_SIGNING_SECRET", TEST_SECRET.to_owned()),
        // Nothing here reads the bus; the relay would only add noise.
        ("THREADLINE_RELAY_ENABLED", "false".to_owned()),
    ]
}

fn event(id: &str) -> Vec<u8> {
    serde_json::to_vec(&app_mention(APP, TEAM, id, "C0ABUSE", "1700000000.000100")).expect("json")
}

fn with(
    mut env: Vec<(&'static str, String)>,
    extra: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    env
}

fn addr(gw: &Proc) -> String {
    gw.base_url.trim_start_matches("http://").to_owned()
}

fn pid(gw: &Proc) -> u32 {
    gw.child.id().expect("the gateway runs")
}

/// A field of `/proc/<pid>/status` in kB (`VmHWM`, `VmRSS`).
fn status_kb(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// Starts the gateway binary with its open-files limit set to `nofile`
/// (as a pod with a low descriptor limit), and waits for `/healthz`.
async fn spawn_gateway_with_nofile(env: &[(&str, String)], nofile: u32) -> Proc {
    let port = free_port();
    let log = threadline_tests::log_dir().join(format!("threadline-gateway-nofile-{port}.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let mut cmd = tokio::process::Command::new("prlimit");
    cmd.arg(format!("--nofile={nofile}:{nofile}"))
        .arg("--")
        .arg(bin_path("threadline-gateway"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("THREADLINE_GATEWAY_ADDR", format!("127.0.0.1:{port}"))
        .env("THREADLINE_LOG_FORMAT", "text")
        .env("RUST_LOG", "warn")
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("prlimit runs the gateway");
    let base_url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the gateway exited ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if http
            .get(format!("{base_url}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        assert!(Instant::now() < deadline, "the gateway did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = child.id().expect("pid");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.contains(&format!(" {nofile} "))),
        "prlimit applied to the gateway itself: {limits}"
    );
    Proc {
        child,
        base_url,
        service: None,
        log: Some(log),
    }
}

/// A socket that connects and sends nothing.
async fn idle(addr: &str) -> TcpStream {
    TcpStream::connect(addr).await.expect("connect")
}

/// A socket that sends part of a request head and stops.
async fn slow_header(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"POST /slack/events HTTP/1.1\r\nHost: gateway\r\nContent-Type: applic")
        .await
        .expect("partial head");
    s
}

/// A socket that made one complete keep-alive request and then says nothing.
async fn kept_alive(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
        .await
        .expect("request");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"\r\n\r\nok") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the health answer comes")
            .expect("read");
        assert!(n > 0, "closed before answering");
        got.extend_from_slice(&buf[..n]);
    }
    s
}

/// Whether the server closes `s` (end of stream or reset) within `limit`;
/// whatever it sends first (an error answer) is read past.
async fn closed_by_server(mut s: TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn metrics(gw: &Proc) -> String {
    reqwest::get(format!("{}/metrics", gw.base_url))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

async fn receipts(db: &TestDb) -> i64 {
    threadline_store::testing::receipts::count_receipts(&db.pool)
        .await
        .expect("count")
}

/// With the descriptor limit lowered and timeouts far away, 500 sockets
/// that never send a request (400 silent, 100 with half a head) do not
/// keep a signed delivery out: the connection cap keeps descriptors free
/// and the oldest idle sockets make room; the server closes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_under_a_low_descriptor_limit_does_not_keep_a_signed_delivery_out() {
    let db = TestDb::new().await;
    seed_installation(&db.pool, APP, TEAM).await;
    let env = with(
        base_env(&db),
        &[
            // Far beyond this test: only the cap can make room.
            ("THREADLINE_GATEWAY_HEADER_TIMEOUT_MS", "60000"),
            ("THREADLINE_GATEWAY_IDLE_TIMEOUT_MS", "60000"),
            ("THREADLINE_DB_MAX_CONNECTIONS", "4"),
        ],
    );
    const NOFILE: u32 = 256;
    let gw = spawn_gateway_with_nofile(&env, NOFILE).await;
    let a = addr(&gw);
    // All at once, as a flood comes; a connect that the server never
    // takes off its accept queue does not complete.
    let flood: Vec<TcpStream> = join_all((0..500).map(|i| {
        let a = a.clone();
        async move {
            let s = if i % 5 == 0 {
                tokio::time::timeout(Duration::from_secs(20), slow_header(&a)).await
            } else {
                tokio::time::timeout(Duration::from_secs(20), idle(&a)).await
            };
            s.expect("the flood socket connects")
        }
    }))
    .await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let r = deliver(
        &client,
        &gw.events_url(),
        TEST_SECRET,
        &event("Ev0FLOOD"),
        None,
    )
    .await
    .expect("the signed delivery is answered while the flood holds its sockets");
    assert_eq!(r.status(), 200);
    assert_eq!(receipts(&db).await, 1);
    // The process cannot hold more sockets than its limit: the rest were
    // closed by the server (not left in the accept queue).
    let closed = join_all(
        flood
            .into_iter()
            .map(|s| closed_by_server(s, Duration::from_secs(10))),
    )
    .await
    .into_iter()
    .filter(|c| *c)
    .count();
    assert!(
        closed >= 500 - NOFILE as usize,
        "only {closed} of 500 flood sockets were closed by the server"
    );
    let m = metrics(&gw).await;
    assert!(
        metric_sum(
            &m,
            "threadline_gateway_connections_closed_total",
            "reason=\"evicted\""
        ) >= 1.0,
        "{m}"
    );
    assert!(gw.terminate().await.success(), "clean stop after the flood");
}

/// Sockets that say nothing, stop halfway through a head, or go quiet
/// after a request are closed by the server (header and idle timeouts),
/// and a signed delivery meanwhile gets its 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_header_connections_are_closed_by_the_server() {
    let db = TestDb::new().await;
    seed_installation(&db.pool, APP, TEAM).await;
    let gw = spawn_gateway(&with(
        base_env(&db),
        &[
            ("THREADLINE_GATEWAY_HEADER_TIMEOUT_MS", "1000"),
            ("THREADLINE_GATEWAY_IDLE_TIMEOUT_MS", "2000"),
        ],
    ))
    .await;
    let a = addr(&gw);
    let mut socks = Vec::new();
    for _ in 0..30 {
        socks.push(idle(&a).await);
        socks.push(slow_header(&a).await);
        socks.push(kept_alive(&a).await);
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let r = deliver(
        &client,
        &gw.events_url(),
        TEST_SECRET,
        &event("Ev0IDLE"),
        None,
    )
    .await
    .expect("delivery");
    assert_eq!(r.status(), 200);
    let closed: Vec<bool> = join_all(
        socks
            .into_iter()
            .map(|s| closed_by_server(s, Duration::from_secs(30))),
    )
    .await;
    assert!(
        closed.iter().all(|c| *c),
        "{} of {} sockets were left open",
        closed.iter().filter(|c| !**c).count(),
        closed.len()
    );
    let m = metrics(&gw).await;
    let header = metric_sum(
        &m,
        "threadline_gateway_connections_closed_total",
        "reason=\"header_timeout\"",
    );
    let idle = metric_sum(
        &m,
        "threadline_gateway_connections_closed_total",
        "reason=\"idle_timeout\"",
    );
    assert!(
        header >= 60.0 && idle >= 30.0,
        "header {header}, idle {idle}:\n{m}"
    );
    assert!(gw.terminate().await.success());
}

/// 400 concurrent unsigned 1 MiB bodies with well-formed signature headers:
/// the gateway reads at most its unverified-bytes budget at once and
/// refuses the rest with 503, so its peak memory grows by a bounded amount;
/// signed deliveries sent during the flood get 200 or 503 (Slack retries),
/// and each is accepted once retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unsigned_bodies_is_bounded_by_the_unverified_budget() {
    let db = TestDb::new().await;
    seed_installation(&db.pool, APP, TEAM).await;
    let gw = spawn_gateway(&base_env(&db)).await;
    let pid = pid(&gw);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    // Warm up: the allocator's first arenas and the intake path.
    let r = deliver(
        &client,
        &gw.events_url(),
        TEST_SECRET,
        &event("Ev0WARM"),
        None,
    )
    .await
    .expect("delivery");
    assert_eq!(r.status(), 200);
    let before_kb = status_kb(pid, "VmHWM");

    let body = Bytes::from(vec![b'{'; 1 << 20]);
    let forged_sig = format!("v0={}", "ab".repeat(32));
    let flood = (0..400).map(|_| {
        let (client, url, body, sig) = (
            client.clone(),
            gw.events_url(),
            body.clone(),
            forged_sig.clone(),
        );
        async move {
            let r = client
                .post(url)
                .header("content-type", "application/json")
                .header("x-slack-request-timestamp", now_unix().to_string())
                .header("x-slack-signature", sig)
                .body(reqwest::Body::from(body))
                .send()
                .await;
            match r {
                Ok(r) => Some(r.status().as_u16()),
                // Refused before the body was read: the server may close
                // while the client is still sending it.
                Err(_) => None,
            }
        }
    });
    // On the flood's own connections: a refusal closes its connection, so
    // none is reused for the next request. A refused delivery may also see
    // the close before its 503, which Slack retries like the 503.
    let during = (0..5).map(|i| {
        let (client, url) = (client.clone(), gw.events_url());
        async move {
            deliver(
                &client,
                &url,
                TEST_SECRET,
                &event(&format!("Ev0DUR{i}")),
                None,
            )
            .await
            .ok()
            .map(|r| r.status().as_u16())
        }
    });
    let (flood, during) = tokio::join!(join_all(flood), join_all(during));
    let after_kb = status_kb(pid, "VmHWM");

    // The default budget is 8 MiB of unverified bodies in flight; 400
    // connections add at most 64 KiB of read buffer each (25 MiB); the
    // rest is allocator slack. Reading every body whole costs 400 MiB.
    let grown_mib = after_kb.saturating_sub(before_kb) / 1024;
    let refused = flood.iter().filter(|s| **s == Some(503)).count();
    let unauthorized = flood.iter().filter(|s| **s == Some(401)).count();
    eprintln!(
        "peak RSS grew by {grown_mib} MiB; {unauthorized} bodies read and refused with 401, \
         {refused} refused unread with 503; signed deliveries during the flood: {during:?}"
    );
    assert!(grown_mib <= 64, "peak RSS grew by {grown_mib} MiB");
    // (408: a body still arriving after a second, cut for a newer one)
    for s in flood.iter().flatten() {
        assert!(matches!(s, 401 | 503 | 408), "an unsigned body got {s}");
    }
    assert!(refused > 0, "the budget refused nothing");
    for s in during.iter().flatten() {
        assert!(matches!(s, 200 | 503), "a signed delivery got {s}");
    }

    // Slack retries what got 503; now every signed delivery gets in.
    for i in 0..5 {
        let r = deliver(
            &client,
            &gw.events_url(),
            TEST_SECRET,
            &event(&format!("Ev0DUR{i}")),
            Some((1, "http_error")),
        )
        .await
        .expect("delivery");
        assert_eq!(r.status(), 200);
    }
    let r = deliver(
        &client,
        &gw.events_url(),
        TEST_SECRET,
        &event("Ev0AFTER"),
        None,
    )
    .await
    .expect("delivery");
    assert_eq!(r.status(), 200);
    assert_eq!(receipts(&db).await, 7, "warm-up, five during, one after");
    assert!(gw.terminate().await.success());
}

/// `X-Slack-Retry-Reason` is not signed: a replayed delivery with any
/// number of invented reasons adds no series beyond Slack's documented
/// reasons and `other`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invented_retry_reasons_do_not_become_metric_series() {
    let db = TestDb::new().await;
    seed_installation(&db.pool, APP, TEAM).await;
    let gw = spawn_gateway(&base_env(&db)).await;
    let client = reqwest::Client::new();
    let body = event("Ev0RSN");
    let documented = [
        "http_timeout",
        "too_many_redirects",
        "connection_failed",
        "ssl_error",
        "http_error",
        "unknown_error",
    ];
    let invented: Vec<String> = (0..40).map(|i| format!("made_up_{i:02}")).collect();
    for reason in documented
        .iter()
        .copied()
        .chain(invented.iter().map(String::as_str))
    {
        let r = deliver(
            &client,
            &gw.events_url(),
            TEST_SECRET,
            &body,
            Some((1, reason)),
        )
        .await
        .expect("delivery");
        assert_eq!(r.status(), 200);
    }
    let m = metrics(&gw).await;
    let series: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("threadline_gateway_slack_retries_total{"))
        .collect();
    assert!(series.len() <= documented.len() + 1, "{series:#?}");
    assert_eq!(
        metric_sum(
            &m,
            "threadline_gateway_slack_retries_total",
            "reason=\"other\""
        ),
        40.0,
        "{series:#?}"
    );
    for reason in documented {
        assert_eq!(
            metric_sum(
                &m,
                "threadline_gateway_slack_retries_total",
                &format!("reason=\"{reason}\"")
            ),
            1.0,
            "{reason}: {series:#?}"
        );
    }
    assert!(gw.terminate().await.success());
}

const HOSTILE: &str = "<script>alert(1)</script>&\"'";

/// The install link: a workspace with a hostile name installs through
/// slack-sim's OAuth flow and its name is escaped on a page with a strict
/// CSP; anonymous GETs are limited per client and overall (429 with
/// Retry-After), so the states they write stay few; expired states are
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_install_link_is_rate_limited_purged_and_renders_names_escaped() {
    let db = TestDb::new().await;
    let sim = spawn_slack_sim(7, 1.0).await;
    let team = sim_ctl(&sim, "teams", json!({"name": HOSTILE})).await["id"]
        .as_str()
        .expect("team")
        .to_owned();
    let app = sim_ctl(&sim, "apps", json!({"name": "Threadline"})).await;
    let port = free_port();
    let gw_url = format!("http://127.0.0.1:{port}");
    let public_keys = threadline_tenancy::secrets::TokenKeys::parse(
        &threadline_tenancy::secrets::TokenKeys::generate_entry("k1").into(),
    )
    .expect("keys")
    .public_entries();
    let env = with(
        base_env(&db),
        &[
            ("SLACK_API_URL", &format!("{}/api/", sim.base_url)),
            (
                "SLACK_AUTHORIZE_URL",
                &format!("{}/oauth/v2/authorize", sim.base_url),
            ),
            (
                "SLACK_CLIENT_ID",
                app["client_id"].as_str().expect("client id"),
            ),
            (
                "SLACK_CLIENT_SECRET",
                app["client_secret"].as_str().expect("secret"),
            ),
            (
                "THREADLINE_OAUTH_REDIRECT_URL",
                &format!("{gw_url}/slack/oauth/callback"),
            ),
            // (the gateway seals to public keys only)
            ("THREADLINE_TOKEN_PUBLIC_KEYS", &public_keys),
            ("THREADLINE_AUDIT_KEY", &"5a".repeat(32)),
            ("THREADLINE_INSTALL_RATE_PER_MINUTE", "20"),
            ("THREADLINE_INSTALL_RATE_PER_CLIENT_PER_MINUTE", "5"),
            ("THREADLINE_GATEWAY_TRUST_FORWARDED_FOR", "true"),
        ],
    );
    let gw = spawn_service_at("threadline-gateway", "THREADLINE_GATEWAY_ADDR", port, &env).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let install = |client: String| {
        let http = http.clone();
        let url = format!("{gw_url}/slack/install");
        async move {
            http.get(url)
                .header("x-forwarded-for", format!("192.0.2.99, {client}"))
                .send()
                .await
                .expect("install")
        }
    };
    let states = || async {
        threadline_store::testing::oauth_states::count_oauth_states(&db.pool)
            .await
            .expect("count")
    };

    // The real flow, for a workspace whose name is markup.
    let r = install("203.0.113.1".into()).await;
    assert_eq!(r.status(), 302);
    let consent = r.headers()[LOCATION].to_str().expect("location").to_owned();
    let cookie = r.headers()[SET_COOKIE]
        .to_str()
        .expect("cookie")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    let r = http
        .get(format!("{consent}&team={team}"))
        .send()
        .await
        .expect("consent");
    assert_eq!(r.status(), 303);
    let callback = r.headers()[LOCATION].to_str().expect("callback").to_owned();
    let r = http
        .get(&callback)
        .header(COOKIE, &cookie)
        .send()
        .await
        .expect("callback");
    assert_eq!(r.status(), 200);
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (csp, nosniff) = (
        header("content-security-policy"),
        header("x-content-type-options"),
    );
    let page = r.text().await.expect("page");
    assert!(page.contains("threadline is installed"), "{page}");
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#x27;"),
        "the name is escaped: {page}"
    );
    assert!(!page.contains("<script"), "{page}");
    for directive in ["default-src 'none'", "frame-ancestors 'none'"] {
        assert!(csp.contains(directive), "CSP {csp:?} lacks {directive}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(nosniff, "nosniff");

    // One client is limited on its own; another still gets a link.
    let mut limited = 0;
    let mut ok = 0;
    for _ in 0..20 {
        let r = install("198.51.100.7".into()).await;
        match r.status().as_u16() {
            302 => ok += 1,
            429 => {
                let wait: u64 = r.headers()["retry-after"]
                    .to_str()
                    .expect("retry-after")
                    .parse()
                    .expect("seconds");
                assert!(wait >= 1);
                limited += 1;
            }
            s => panic!("install answered {s}"),
        }
    }
    assert!(ok >= 5 && limited >= 10, "{ok} links, {limited} refusals");
    assert_eq!(install("198.51.100.8".into()).await.status(), 302);

    // States past their validity are deleted.
    threadline_store::testing::oauth_states::expire_oauth_states(&db.pool)
        .await
        .expect("expire");
    assert_eq!(install("198.51.100.9".into()).await.status(), 302);
    assert_eq!(states().await, 1, "expired states were purged");

    // Many clients at once: the overall limit holds the rows down.
    let started = Instant::now();
    let answers =
        join_all((0..300).map(|i| install(format!("10.9.{}.{}", i / 250, i % 250 + 1)))).await;
    let elapsed = started.elapsed().as_secs();
    let links = answers.iter().filter(|r| r.status() == 302).count();
    let refused = answers.iter().filter(|r| r.status() == 429).count();
    assert_eq!(links + refused, 300);
    // A burst of 20 a minute, one more every 3 s.
    let bound = 20 + (elapsed as usize) / 3 + 1;
    assert!(links <= bound, "{links} links (bound {bound})");
    assert!(
        states().await as usize <= bound + 1,
        "{} states",
        states().await
    );
    assert!(gw.terminate().await.success());
    drop(sim);
}

/// A delivery whose signature headers are refused is answered before its
/// body is read (the server does not wait for a body that never comes), and
/// its connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_signature_headers_are_refused_before_the_body_arrives() {
    let db = TestDb::new().await;
    let gw = spawn_gateway(&base_env(&db)).await;
    let stale = (now_unix() - 3600).to_string();
    for head in [
        format!(
            "x-slack-request-timestamp: {stale}\r\nx-slack-signature: v0={}\r\n",
            "ab".repeat(32)
        ),
        format!("x-slack-request-timestamp: {}\r\n", now_unix()),
        "x-slack-signature: v0=zz\r\n".to_owned(),
    ] {
        let mut s = TcpStream::connect(addr(&gw)).await.expect("connect");
        s.write_all(
            format!("POST /slack/events HTTP/1.1\r\nHost: gateway\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n{head}\r\n{{")
                .as_bytes(),
        )
        .await
        .expect("head");
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        let answer = tokio::time::timeout(Duration::from_secs(10), async {
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        assert!(answer.is_ok(), "no answer without the body");
        let answer = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(answer.starts_with("http/1.1 401"), "{answer}");
        // The unread body leaves the connection unusable: it says so, and
        // no client or proxy sends another request on it.
        assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    }
    assert!(gw.terminate().await.success());
}

/// Bodies that declare a megabyte and then stall (heads that pass the
/// header check with a fresh timestamp and any well-formed signature):
/// they cannot spend the part of the budget kept for small bodies, so a
/// signed delivery is still accepted while they are held, and each is cut
/// with 408 at its deadline, freeing its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_stall_neither_starve_signed_deliveries_nor_hold_the_budget() {
    let db = TestDb::new().await;
    seed_installation(&db.pool, APP, TEAM).await;
    let gw = spawn_gateway(&with(
        base_env(&db),
        &[("THREADLINE_GATEWAY_BODY_TIMEOUT_MS", "3000")],
    ))
    .await;
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(addr(&gw)).await.expect("connect");
        s.write_all(
            format!(
                "POST /slack/events HTTP/1.1\r\nHost: gateway\r\ncontent-type: application/json\r\ncontent-length: 1048576\r\nx-slack-request-timestamp: {}\r\nx-slack-signature: v0={}\r\n\r\n{{",
                now_unix(),
                "ab".repeat(32)
            )
            .as_bytes(),
        )
        .await
        .expect("head");
        stalled.push(s);
    }
    // The stalled bodies have taken what they may of the budget (the large
    // part: six of them; the other two are refused with 503) before the
    // signed delivery is sent.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = |text: String| {
        text.lines()
            .find_map(|l| l.strip_prefix("threadline_gateway_unverified_budget_refusals_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    while refused(metrics(&gw).await) < 2.0 {
        assert!(
            Instant::now() < deadline,
            "the stalled bodies never took the budget"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = reqwest::Client::new();
    let r = deliver(
        &client,
        &gw.events_url(),
        TEST_SECRET,
        &event("Ev0STALL"),
        None,
    )
    .await
    .expect("delivery");
    assert_eq!(
        r.status(),
        200,
        "a signed delivery while large bodies stall"
    );
    // Every stalled body gets its answer (408 at the deadline, or 503 if it
    // found the budget spent), never a wait for the whole request timeout.
    let mut answers = Vec::new();
    for mut s in stalled {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        let _ = tokio::time::timeout(Duration::from_secs(30), async {
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
        answers.push(head.split(' ').nth(1).unwrap_or("none").to_owned());
    }
    assert_eq!(
        answers.iter().filter(|a| *a == "408").count(),
        6,
        "each stalled body that held a share is cut at its deadline: {answers:?}"
    );
    assert!(
        answers.iter().all(|a| a == "408" || a == "503"),
        "{answers:?}"
    );
    assert_eq!(receipts(&db).await, 1);
    assert!(gw.terminate().await.success());
}

/// Heads with a current timestamp and a well-formed (wrong) signature that
/// declare a one-byte body and never send it: each holds at least the least
/// share of the unverified budget, so only a few hold connections at all
/// (the rest are refused unread), and a signed delivery takes the place of
/// the one that has waited longest. It is answered while every stalled body
/// is still within its body timeout (so no timeout freed anything for it);
/// without this, the stalled bodies filled the connection cap and it waited
/// for their timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_one_byte_bodies_cannot_hold_the_connections_a_signed_delivery_needs() {
    // The smallest cap and budget: 40 stalled bodies against 16 places.
    stalled_bodies_then_a_signed_delivery(
        40,
        &[
            ("THREADLINE_GATEWAY_MAX_CONNECTIONS", "16"),
            ("THREADLINE_GATEWAY_UNVERIFIED_BYTES", "65536"),
            ("THREADLINE_GATEWAY_MAX_BODY_BYTES", "16384"),
        ],
    )
    .await;
}

/// The same at the gateway's defaults (1,024 connections, 8 MiB of
/// unverified bodies), by the attack's own numbers: 1,100 stalled bodies,
/// more than the connection cap and twice what the budget lets hold a
/// place, renewed by nobody. The signed delivery is answered before the
/// first of them could time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eleven_hundred_stalled_bodies_at_the_defaults_do_not_hold_up_a_signed_delivery() {
    stalled_bodies_then_a_signed_delivery(1100, &[]).await;
}

/// `n` heads with a current timestamp and a well-formed (wrong) signature
/// declaring a one-byte body that never comes, against a gateway with
/// `settings` and the longest body timeout, then one signed delivery: it
/// must be answered 200 while every stalled body is still within its body
/// timeout, so that no timeout freed anything for it (the bound stated: the
/// body timeout, counted from the first stalled head).
async fn stalled_bodies_then_a_signed_delivery(n: usize, settings: &[(&'static str, &str)]) {
    let db = TestDb::new().await;
    seed_installation(&db.pool, APP, TEAM).await;
    let mut env = vec![("THREADLINE_GATEWAY_BODY_TIMEOUT_MS", "9000")];
    env.extend_from_slice(settings);
    let gw = spawn_gateway(&with(base_env(&db), &env)).await;
    let body_timeout = Duration::from_millis(9000);
    let started = Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..n {
        let Ok(mut s) = TcpStream::connect(addr(&gw)).await else {
            continue;
        };
        let head = format!(
            "POST /slack/events HTTP/1.1\r\nHost: gateway\r\ncontent-type: application/json\r\ncontent-length: 1\r\nx-slack-request-timestamp: {}\r\nx-slack-signature: v0={}\r\n\r\n",
            now_unix(),
            "ab".repeat(32)
        );
        let _ = s.write_all(head.as_bytes()).await;
        stalled.push(s);
    }
    assert_eq!(
        stalled.len(),
        n,
        "every stalled head was sent (the test process may hold {n} sockets)"
    );
    // (long enough for the oldest stalled bodies to be cut for a new one)
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let client = reqwest::Client::new();
    let r = tokio::time::timeout(
        body_timeout.saturating_sub(started.elapsed()),
        deliver(
            &client,
            &gw.events_url(),
            TEST_SECRET,
            &event("Ev0SLOW1"),
            None,
        ),
    )
    .await;
    let answered_within = started.elapsed();
    let status = r.ok().and_then(Result::ok).map(|r| r.status().as_u16());
    assert_eq!(
        status,
        Some(200),
        "the signed delivery after {n} stalled bodies was answered before any stalled \
         body's timeout (after {answered_within:?})"
    );
    assert!(
        answered_within < body_timeout,
        "answered while the stalled bodies were all within their timeout"
    );
    assert_eq!(receipts(&db).await, 1);
    drop(stalled);
    assert!(gw.terminate().await.success());
}

/// Refusals anyone can cause at will are logged at a bounded rate: a flood
/// of deliveries signed with the wrong secret gives one warning line (the
/// first at once, the next a minute later with how many went unlogged),
/// and the metric counts every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_forged_signatures_is_counted_each_and_logged_once_a_minute() {
    const FORGED: usize = 200;
    let db = TestDb::new().await;
    let gw = spawn_gateway(&base_env(&db)).await;
    let http = reqwest::Client::new();
    let body = event("EvForged");
    for _ in 0..FORGED {
        let (ts, sig) =
            threadline_testkit::slack::signature("not the signing secret", now_unix(), &body);
        let status = http
            .post(format!("{}/slack/events", gw.base_url))
            .header("content-type", "application/json")
            .header("x-slack-request-timestamp", ts)
            .header("x-slack-signature", sig)
            .body(body.clone())
            .send()
            .await
            .expect("answered")
            .status();
        assert_eq!(status, reqwest::StatusCode::UNAUTHORIZED);
    }
    let counted = metric_sum(
        &metrics(&gw).await,
        "threadline_auth_failures_total",
        "reason=\"signature_mismatch\"",
    );
    assert_eq!(counted, FORGED as f64, "every refusal counted");
    let log = std::fs::read_to_string(gw.log.as_ref().expect("a log")).expect("the log");
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("unverified request refused"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one line for the flood of {FORGED}; the first: {:?}",
        lines.first()
    );
    assert!(lines[0].contains("signature_mismatch"), "{}", lines[0]);
    assert_eq!(receipts(&db).await, 0, "nothing forged was recorded");
    assert!(gw.terminate().await.success());
}
