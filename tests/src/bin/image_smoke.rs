//! `make image-smoke`: the container images, run for real.
//!
//! Every service runs in its own container made from the images that
//! `make images` built (`threadline-<name>:$IMAGE_TAG`, default `dev`), as
//! Kubernetes runs them: read-only root filesystem, no capabilities, no
//! privilege escalation, the image's own user. The containers share the
//! host's network, so they reach this machine's Postgres and NATS as the
//! tests do, on a fresh database and a bus prefix of their own; each gets
//! its listen address set (as the Kubernetes manifests set it), and the
//! images' own defaults are checked to listen on all interfaces on the
//! port they expose.
//!
//! Checked, from the outside: the CLI image migrates the database and
//! registers the installation; each service process (and slack-sim's) runs
//! as uid and gid 65532 on a read-only root filesystem with no capabilities,
//! and answers `/healthz` and `/readyz`; a mention posted in slack-sim
//! (itself in a container) gets exactly one reply in its thread, written by
//! the built-in model about that very message; each service stops cleanly
//! on SIGTERM (exit 0). Everything started is removed, also on failure;
//! scripts/image-smoke.sh removes this run's containers by their label
//! should the process itself be killed. Settings reach the containers
//! through files only this user can read, never on a command line.

use std::process::{Command, ExitCode, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use threadline_testkit::{TestDb, nats_url, sim::SimWorkspace, slack, unique_prefix};
use threadline_tests::free_port;

const READY_LIMIT: Duration = Duration::from_secs(60);
const ANSWER_LIMIT: Duration = Duration::from_secs(60);

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running docker: {e}"))
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).trim().to_owned()
}

/// A container this run started; removed when dropped.
struct Container {
    name: String,
    role: &'static str,
    port: Option<u16>,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", "-v", &self.name]);
    }
}

impl Container {
    fn logs(&self) -> String {
        let o = docker(&["logs", "--tail", "40", &self.name]);
        format!("{}{}", text(&o.stdout), text(&o.stderr))
    }

    fn inspect(&self, format: &str) -> String {
        text(&docker(&["inspect", "-f", format, &self.name]).stdout)
    }
}

/// The hardening every container gets, as the Kubernetes manifests ask
/// (readOnlyRootFilesystem, drop ALL, allowPrivilegeEscalation false).
const HARDENED: &[&str] = &[
    "--network",
    "host",
    "--read-only",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
];

/// A file only this user can read, removed when dropped.
struct PrivateFile(std::path::PathBuf);

impl PrivateFile {
    fn new(path: std::path::PathBuf, text: &str) -> Result<Self, String> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(Self(path))
    }

    fn arg(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for PrivateFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct Run {
    tag: String,
    id: String,
    /// The settings every container gets (`--env-file`), so that keys and
    /// tokens appear in no argument list (`ps`) and no failure message.
    env_file: PrivateFile,
    /// `THREADLINE_SMOKE_RUN` of scripts/image-smoke.sh: the label by which
    /// it removes this run's containers however the run ends.
    label: String,
}

impl Run {
    fn image(&self, name: &str) -> String {
        format!("threadline-{name}:{}", self.tag)
    }

    /// `--env-file`s (the run's, then `more`), the label, and `extra`
    /// settings that are not secret (listen addresses, switches).
    fn options(&self, extra: &[(&str, String)], more: Option<&PrivateFile>) -> Vec<String> {
        let mut args = vec!["--env-file".to_owned(), self.env_file.arg()];
        if let Some(f) = more {
            args.extend(["--env-file".to_owned(), f.arg()]);
        }
        args.extend([
            "--label".to_owned(),
            format!("threadline-smoke={}", self.label),
        ]);
        for (k, v) in extra {
            args.extend(["-e".to_owned(), format!("{k}={v}")]);
        }
        args
    }

    /// Runs the CLI image to completion (with the settings of `more` too);
    /// its output on failure.
    fn cli(&self, args: &[&str], more: Option<&PrivateFile>) -> Result<String, String> {
        let options = self.options(&[], more);
        let mut all: Vec<&str> = vec!["run", "--rm"];
        all.extend(HARDENED);
        all.extend(options.iter().map(String::as_str));
        let image = self.image("cli");
        all.push(&image);
        all.extend(args);
        let o = docker(&all);
        if o.status.success() {
            Ok(text(&o.stdout))
        } else {
            Err(format!(
                "threadline {} in {image} exited {}: {}{}",
                args.join(" "),
                o.status,
                text(&o.stdout),
                text(&o.stderr)
            ))
        }
    }

    /// Starts a detached container of `image` with the run's settings.
    fn start(
        &self,
        role: &'static str,
        image: &str,
        port: u16,
        extra: &[(&str, String)],
    ) -> Result<Container, String> {
        let name = format!("threadline-smoke-{}-{role}", self.id);
        let options = self.options(extra, None);
        let image = self.image(image);
        let mut all: Vec<&str> = vec!["run", "-d", "--name", &name];
        all.extend(HARDENED);
        all.extend(options.iter().map(String::as_str));
        all.push(&image);
        let o = docker(&all);
        if !o.status.success() {
            return Err(format!("docker run {image} ({role}): {}", text(&o.stderr)));
        }
        Ok(Container {
            name,
            role,
            port: Some(port),
        })
    }
}

/// Waits until `url` answers 2xx while the container runs.
async fn wait_ok(http: &reqwest::Client, c: &Container, path: &str) -> Result<(), String> {
    let port = c.port.expect("a service port");
    let url = format!("http://127.0.0.1:{port}{path}");
    let start = Instant::now();
    loop {
        if let Ok(r) = http.get(&url).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        if c.inspect("{{.State.Running}}") != "true" {
            return Err(format!(
                "{} exited ({}) before answering {path}; it printed:\n{}",
                c.role,
                c.inspect("{{.State.ExitCode}}"),
                c.logs()
            ));
        }
        if start.elapsed() > READY_LIMIT {
            return Err(format!(
                "{} did not answer {path} within {} s; it printed:\n{}",
                c.role,
                READY_LIMIT.as_secs(),
                c.logs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The container's process runs as 65532:65532 on a read-only root
/// filesystem with no capabilities, read from the kernel (the host's /proc),
/// not from the image.
fn hardened(c: &Container) -> Result<String, String> {
    let pid = c.inspect("{{.State.Pid}}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("{}: reading /proc/{pid}/status: {e}", c.role))?;
    let ids = |key: &str| -> Vec<String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let (uid, gid) = (ids("Uid:"), ids("Gid:"));
    if uid.is_empty()
        || gid.is_empty()
        || uid.iter().any(|u| u != "65532")
        || gid.iter().any(|g| g != "65532")
    {
        return Err(format!(
            "{} runs as uid {uid:?} gid {gid:?}, not 65532",
            c.role
        ));
    }
    if c.inspect("{{.HostConfig.ReadonlyRootfs}}") != "true" {
        return Err(format!("{}: root filesystem is writable", c.role));
    }
    let caps = ids("CapEff:");
    if caps.first().map(String::as_str) != Some("0000000000000000") {
        return Err(format!("{} has capabilities {caps:?}", c.role));
    }
    Ok(format!(
        "uid/gid 65532, read-only root, no capabilities (image user {})",
        c.inspect("{{.Config.User}}")
    ))
}

/// The image's own listen setting is `0.0.0.0:<a port it EXPOSEs>`, as
/// deploy/Dockerfile declares.
fn listens_on_all_interfaces(image: &str, setting: &str) -> Result<(), String> {
    let out = docker(&[
        "image",
        "inspect",
        "-f",
        "{{range .Config.Env}}{{println .}}{{end}}{{range $p, $_ := .Config.ExposedPorts}}{{println $p}}{{end}}",
        image,
    ]);
    let text = text(&out.stdout);
    let addr = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{setting}=")))
        .ok_or_else(|| format!("{image} sets no {setting}"))?;
    let port = addr
        .strip_prefix("0.0.0.0:")
        .ok_or_else(|| format!("{image}: {setting}={addr} does not listen on all interfaces"))?;
    if !text.lines().any(|l| l == format!("{port}/tcp")) {
        return Err(format!(
            "{image}: {setting}={addr} but port {port}/tcp is not exposed"
        ));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match smoke().await {
        Ok(()) => {
            println!("image-smoke: ok");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("image-smoke: FAIL: {why}");
            ExitCode::FAILURE
        }
    }
}

async fn smoke() -> Result<(), String> {
    let tag = std::env::var("IMAGE_TAG").unwrap_or_else(|_| "dev".to_owned());
    for name in ["cli", "slack-sim"] {
        let image = format!("threadline-{name}:{tag}");
        if !docker(&["image", "inspect", &image]).status.success() {
            return Err(format!("image {image} not found: run `make images` first"));
        }
    }
    for (name, setting) in [
        ("gateway", "THREADLINE_GATEWAY_ADDR"),
        ("context-builder", "THREADLINE_CONTEXT_BUILDER_ADDR"),
        ("inference", "THREADLINE_INFERENCE_ADDR"),
        ("publisher", "THREADLINE_PUBLISHER_ADDR"),
        ("slack-sim", "SLACK_SIM_ADDR"),
    ] {
        listens_on_all_interfaces(&format!("threadline-{name}:{tag}"), setting)?;
    }
    let db = TestDb::empty().await;
    let prefix = unique_prefix();
    let sim_port = free_port();
    let sim_url = format!("http://127.0.0.1:{sim_port}");
    let id = prefix.to_ascii_lowercase().replace('_', "-");
    let token_keys = threadline_tenancy::secrets::TokenKeys::generate_entry("k1");
    let public_keys = threadline_tenancy::secrets::TokenKeys::parse(&token_keys.clone().into())
        .map_err(|e| e.to_string())?
        .public_entries();
    let settings: String = [
        ("DATABASE_URL", db.url.clone()),
        ("NATS_URL", nats_url()),
        ("THREADLINE_BUS_PREFIX", prefix.clone()),
        // The private token key for the services that open tokens (and
        // the CLI); the gateway's containers get it emptied and the public
        // half instead.
        ("THREADLINE_TOKEN_KEYS", token_keys.clone()),
        ("THREADLINE_AUDIT_KEY", "5a".repeat(32)),
        (
            "THREADLINE_DEAD_LETTER_KEYS",
            "d1:".to_owned() + &"17".repeat(32),
        ),
        ("SLACK_SIGNING_SECRET", slack::TEST_SECRET.to_owned()),
        ("SLACK_API_URL", format!("{sim_url}/api/")),
        ("THREADLINE_LOG_FORMAT", "text".to_owned()),
    ]
    .iter()
    .map(|(k, v)| format!("{k}={v}\n"))
    .collect();
    let run = Run {
        tag,
        label: std::env::var("THREADLINE_SMOKE_RUN").unwrap_or_else(|_| id.clone()),
        env_file: PrivateFile::new(
            std::env::temp_dir().join(format!("threadline-smoke-{id}.env")),
            &settings,
        )?,
        id,
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?;
    let nats = async_nats::connect(nats_url())
        .await
        .map_err(|e| format!("NATS at {}: {e}", nats_url()))?;
    let js = async_nats::jetstream::new(nats);
    // A panic inside (a helper's assertion) still cleans up below.
    use futures::FutureExt as _;
    let result = std::panic::AssertUnwindSafe(pipeline(
        &run,
        &http,
        &sim_url,
        sim_port,
        &Logins {
            db: &db,
            public_keys: &public_keys,
        },
    ))
    .catch_unwind()
    .await
    .unwrap_or_else(|panic| {
        Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic".to_owned()))
    });
    threadline_testkit::delete_streams(&js, &prefix).await;
    drop(run);
    drop(db);
    result
}

/// How each service logs in: its own database role
/// (`migrations/0029_service_roles.sql`, the relay's 0031), the private token keys only
/// where tokens are opened, and for the gateway the public ones.
struct Logins<'a> {
    db: &'a TestDb,
    public_keys: &'a str,
}

impl Logins<'_> {
    fn of(&self, role: &str) -> Vec<(&'static str, String)> {
        let mut v = vec![("DATABASE_URL", self.db.url_as(role))];
        // Only the context-builder and the publisher open tokens: the
        // gateway seals to the public half, inference holds no key at all.
        let gateway = matches!(role, "threadline_gateway" | "threadline_relay");
        if gateway || role == "threadline_inference" {
            v.push(("THREADLINE_TOKEN_KEYS", String::new()));
        }
        if gateway {
            v.push(("THREADLINE_TOKEN_PUBLIC_KEYS", self.public_keys.to_owned()));
        }
        v
    }
}

async fn pipeline(
    run: &Run,
    http: &reqwest::Client,
    sim_url: &str,
    sim_port: u16,
    logins: &Logins<'_>,
) -> Result<(), String> {
    println!("image-smoke: migrating with {}", run.image("cli"));
    run.cli(&["migrate"], None)?;

    let sim = run.start(
        "slack-sim",
        "slack-sim",
        sim_port,
        &[
            ("SLACK_SIM_ADDR", format!("127.0.0.1:{sim_port}")),
            ("SLACK_SIM_TIME_SCALE", "0.01".to_owned()),
        ],
    )?;
    wait_ok(http, &sim, "/_sim/calls").await?;
    println!(
        "image-smoke: slack-sim ({}) answers; {}",
        run.image("slack-sim"),
        hardened(&sim)?
    );

    // The relay first (it declares the streams), then the gateway without
    // one, as the Kubernetes manifests deploy them.
    let addr = |setting: &'static str, port: u16| (setting, format!("127.0.0.1:{port}"));
    let (relay_port, gw_port) = (free_port(), free_port());
    let [cb_port, inf_port, pub_port] = [free_port(), free_port(), free_port()];
    let services = [
        (
            "relay",
            "gateway",
            relay_port,
            vec![
                addr("THREADLINE_GATEWAY_ADDR", relay_port),
                ("THREADLINE_RELAY_ENABLED", "true".to_owned()),
            ]
            .into_iter()
            .chain(logins.of("threadline_relay"))
            .collect::<Vec<_>>(),
        ),
        (
            "gateway",
            "gateway",
            gw_port,
            vec![
                addr("THREADLINE_GATEWAY_ADDR", gw_port),
                ("THREADLINE_RELAY_ENABLED", "false".to_owned()),
            ]
            .into_iter()
            .chain(logins.of("threadline_gateway"))
            .collect::<Vec<_>>(),
        ),
        (
            "context-builder",
            "context-builder",
            cb_port,
            std::iter::once(addr("THREADLINE_CONTEXT_BUILDER_ADDR", cb_port))
                .chain(logins.of("threadline_context_builder"))
                .collect::<Vec<_>>(),
        ),
        (
            "inference",
            "inference",
            inf_port,
            std::iter::once(addr("THREADLINE_INFERENCE_ADDR", inf_port))
                .chain(logins.of("threadline_inference"))
                .collect::<Vec<_>>(),
        ),
        (
            "publisher",
            "publisher",
            pub_port,
            std::iter::once(addr("THREADLINE_PUBLISHER_ADDR", pub_port))
                .chain(logins.of("threadline_publisher"))
                .collect::<Vec<_>>(),
        ),
    ];
    let mut running = Vec::new();
    for (role, image, port, extra) in services {
        let c = run.start(role, image, port, &extra)?;
        wait_ok(http, &c, "/healthz").await?;
        wait_ok(http, &c, "/readyz").await?;
        println!(
            "image-smoke: {role} ({}) answers /healthz and /readyz; {}",
            run.image(image),
            hardened(&c)?
        );
        running.push(c);
    }

    let ws = SimWorkspace::create(
        sim_url,
        json!({"signing_secret": slack::TEST_SECRET,
               "request_urls": [format!("http://127.0.0.1:{gw_port}/slack/events")],
               "events": ["app_mention", "message.channels"]}),
        &["chat:write", "channels:history", "channels:read"],
        None,
    )
    .await;
    let (app, bot_user, bot_id) = (ws.app_id(), ws.bot_user(), ws.bot_id());
    // The token through the environment (the CLI reads SLACK_BOT_TOKEN),
    // never on a command line.
    let token = PrivateFile::new(
        std::env::temp_dir().join(format!("threadline-smoke-{}.token", run.id)),
        &format!("SLACK_BOT_TOKEN={}\n", ws.token()),
    )?;
    run.cli(
        &[
            "install",
            "add",
            "--team",
            &ws.team,
            "--app",
            &app,
            "--bot-user",
            &bot_user,
            "--bot-id",
            &bot_id,
        ],
        Some(&token),
    )?;
    drop(token);
    println!(
        "image-smoke: installation registered with {}",
        run.image("cli")
    );

    let asked = ws
        .post(&format!("<@{bot_user}> are the images healthy?"), None)
        .await;
    let thread = format!("channels/{}/threads/{asked}", ws.channel);
    let answers = |v: &Value| -> Vec<Value> {
        v["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m["app_id"].as_str() == Some(app.as_str()))
            .collect()
    };
    let start = Instant::now();
    loop {
        if !answers(&ws.get(&thread).await).is_empty() {
            break;
        }
        if start.elapsed() > ANSWER_LIMIT {
            let logs: Vec<String> = running
                .iter()
                .map(|c| format!("--- {}:\n{}", c.role, c.logs()))
                .collect();
            return Err(format!(
                "no reply in the thread within {} s; the services printed:\n{}",
                ANSWER_LIMIT.as_secs(),
                logs.join("\n")
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A moment more, to catch a second reply.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let replies = answers(&ws.get(&thread).await);
    if replies.len() != 1 {
        return Err(format!(
            "{} replies of the app in the thread, not one: {replies:?}",
            replies.len()
        ));
    }
    let body = replies[0]["text"].as_str().unwrap_or_default();
    if !body.contains(&format!("Answering {asked}; read")) {
        return Err(format!(
            "the reply is not the built-in model's answer to {asked}: {body:?}"
        ));
    }
    println!(
        "image-smoke: the mention got one reply in its thread, from slack-sim's side ({} s)",
        start.elapsed().as_secs()
    );

    // Each service stops cleanly on SIGTERM, as Kubernetes stops a pod.
    for c in running.iter().rev() {
        let o = docker(&["stop", "-t", "30", &c.name]);
        let code = c.inspect("{{.State.ExitCode}}");
        if !o.status.success() || code != "0" {
            return Err(format!(
                "{} did not stop cleanly on SIGTERM (exit {code}); it printed:\n{}",
                c.role,
                c.logs()
            ));
        }
    }
    println!("image-smoke: every service stopped cleanly on SIGTERM");
    drop(running);
    drop(sim);
    Ok(())
}
