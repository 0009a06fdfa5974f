//! Drives signed, distinct Events API deliveries at a fixed concurrency
//! against a running gateway and reports throughput and ack latency.
//! Every request is a new event (a new receipt, a new durable commit).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use threadline_slack::{SigningSecret, sign};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Load the gateway with signed, distinct deliveries")]
struct Args {
    /// Events endpoint of the gateway.
    #[arg(long, default_value = "http://127.0.0.1:3900/slack/events")]
    url: String,
    #[arg(long, default_value = "A0BENCH")]
    app: String,
    #[arg(long, default_value = "T0BENCH")]
    team: String,
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    #[arg(long, default_value_t = 3)]
    warmup_seconds: u64,
    /// Delete the JetStream streams of this bus prefix and exit.
    #[arg(long)]
    delete_streams: Option<String>,
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
}

fn body(app: &str, team: &str, event_id: &str, n: u64) -> Vec<u8> {
    let ts = format!("1700000000.{:06}", n % 1_000_000);
    serde_json::to_vec(&serde_json::json!({
        "token": "bench", "team_id": team, "api_app_id": app, "type": "event_callback",
        "event_id": event_id, "event_time": 1_700_000_000,
        "event": {"type": "app_mention", "user": "U0USER", "text": "<@U0BOT> hello", "ts": ts,
                  "channel": "C0BENCH", "event_ts": ts},
        "authorizations": [{"enterprise_id": null, "team_id": team, "user_id": "U0BOT", "is_bot": true,
                            "is_enterprise_install": false}],
        "is_ext_shared_channel": false
    }))
    .unwrap_or_default()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(prefix) = &args.delete_streams {
        return delete_streams(&args.nats_url, prefix).await;
    }
    // The signing secret from the environment only: never on a command
    // line, where `ps` shows it.
    let secret = std::env::var("SLACK_SIGNING_SECRET")
        .ok()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            anyhow::anyhow!("set SLACK_SIGNING_SECRET (the gateway's signing secret)")
        })?;
    let secret = SigningSecret::new(&secret)?;
    let target = Target::parse(&args.url)?;
    let run_id = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));

    // One keep-alive HTTP/1.1 connection per worker, requests written as raw
    // bytes: the load generator shares the machine's cores with the gateway,
    // Postgres and NATS, so it must cost as little as possible.
    let mut tasks = Vec::new();
    for worker in 0..args.concurrency {
        let (secret, target, app, team) = (
            secret.clone(),
            target.clone(),
            args.app.clone(),
            args.team.clone(),
        );
        let (measuring, stop) = (measuring.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat_us: Vec<u32> = Vec::with_capacity(1 << 16);
            let (mut ok, mut failed) = (0u64, 0u64);
            let mut conn: Option<Conn> = None;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let event_id = format!("Ev{run_id}W{worker}N{n}");
                let b = body(&app, &team, &event_id, n);
                let ts = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0)
                    .to_string();
                let sig = sign(&secret, &ts, &b);
                let started = Instant::now();
                let status = match conn.as_mut() {
                    Some(c) => c.post(&target, &ts, &sig, &b).await,
                    None => match Conn::open(&target).await {
                        Ok(mut c) => {
                            let s = c.post(&target, &ts, &sig, &b).await;
                            conn = Some(c);
                            s
                        }
                        Err(e) => Err(e),
                    },
                };
                let good = matches!(status, Ok(200..=299));
                if status.is_err() {
                    conn = None;
                }
                if measuring.load(Ordering::Relaxed) {
                    lat_us.push(started.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    if good { ok += 1 } else { failed += 1 }
                }
            }
            (lat_us, ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_secs(args.warmup_seconds)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);

    let (mut all, mut ok, mut failed) = (Vec::new(), 0u64, 0u64);
    for t in futures::future::join_all(tasks).await {
        let (l, o, f) = t?;
        all.extend(l);
        ok += o;
        failed += f;
    }
    all.sort_unstable();
    let pct = |p: f64| -> f64 {
        if all.is_empty() {
            return 0.0;
        }
        let i = ((all.len() as f64 * p).ceil() as usize).clamp(1, all.len()) - 1;
        all[i] as f64 / 1000.0
    };
    let report = serde_json::json!({
        "concurrency": args.concurrency,
        "seconds": elapsed,
        "accepted": ok,
        "failed": failed,
        "accepted_per_second": (ok as f64 / elapsed).round(),
        "ack_latency_ms": {"p50": pct(0.50), "p90": pct(0.90), "p99": pct(0.99), "max": pct(1.0)},
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    if failed > 0 {
        anyhow::bail!("{failed} deliveries were not answered 2xx");
    }
    Ok(())
}

#[derive(Clone)]
struct Target {
    addr: String,
    host: String,
    path: String,
}

impl Target {
    fn parse(url: &str) -> anyhow::Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow::anyhow!("--url must be http://host:port/path"))?;
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        Ok(Self {
            addr: host.to_owned(),
            host: host.to_owned(),
            path: format!("/{path}"),
        })
    }
}

struct Conn {
    stream: tokio::io::BufStream<tokio::net::TcpStream>,
    line: String,
}

impl Conn {
    async fn open(t: &Target) -> std::io::Result<Self> {
        let tcp = tokio::net::TcpStream::connect(&t.addr).await?;
        tcp.set_nodelay(true)?;
        Ok(Self {
            stream: tokio::io::BufStream::new(tcp),
            line: String::new(),
        })
    }

    /// Sends one signed POST and reads the response; returns its status.
    async fn post(&mut self, t: &Target, ts: &str, sig: &str, body: &[u8]) -> std::io::Result<u16> {
        use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
        let head = format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             x-slack-request-timestamp: {ts}\r\nx-slack-signature: {sig}\r\n\r\n",
            t.path,
            t.host,
            body.len()
        );
        self.stream.write_all(head.as_bytes()).await?;
        self.stream.write_all(body).await?;
        self.stream.flush().await?;
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "bad HTTP response");
        self.line.clear();
        self.stream.read_line(&mut self.line).await?;
        let status: u16 = self
            .line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)?;
        let mut len = 0usize;
        loop {
            self.line.clear();
            if self.stream.read_line(&mut self.line).await? == 0 {
                return Err(bad());
            }
            let l = self.line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().map_err(|_| bad())?;
            }
        }
        let mut sink = vec![0u8; len];
        self.stream.read_exact(&mut sink).await?;
        Ok(status)
    }
}

async fn delete_streams(url: &str, prefix: &str) -> anyhow::Result<()> {
    use futures::StreamExt as _;
    let js = async_nats::jetstream::new(async_nats::connect(url).await?);
    let upper = format!("{}_", prefix.to_ascii_uppercase());
    let mut names = js.stream_names();
    let mut doomed = Vec::new();
    while let Some(name) = names.next().await {
        let name = name?;
        if name.starts_with(&upper) {
            doomed.push(name);
        }
    }
    for name in doomed {
        js.delete_stream(&name).await?;
    }
    Ok(())
}
