//! Token buckets for anonymous routes: one for the whole gateway and one
//! per client address, both of which a request must pass.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Client buckets kept at most; beyond it, full (idle) ones are forgotten,
/// and if none is, new clients are refused until some are.
const MAX_CLIENTS: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(capacity: f64, now: Instant) -> Self {
        Self {
            tokens: capacity,
            at: now,
        }
    }

    fn refill(&mut self, capacity: f64, per_sec: f64, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_sec).min(capacity);
        self.at = now;
    }

    /// How long until one token is there (zero when it is).
    fn wait(&self, per_sec: f64) -> Duration {
        if self.tokens >= 1.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - self.tokens) / per_sec)
        }
    }
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Overall,
    Client,
}

impl Refused {
    pub fn label(self) -> &'static str {
        match self {
            Refused::Overall => "overall",
            Refused::Client => "client",
        }
    }
}

#[derive(Debug)]
struct Buckets {
    overall: Bucket,
    clients: HashMap<IpAddr, Bucket>,
}

/// Requests per minute overall and per client; each bucket holds a
/// minute's worth and refills evenly.
#[derive(Debug)]
pub struct Limiter {
    overall_per_minute: f64,
    client_per_minute: f64,
    buckets: Mutex<Buckets>,
}

impl Limiter {
    pub fn new(overall_per_minute: u32, client_per_minute: u32) -> Self {
        let overall_per_minute = f64::from(overall_per_minute.max(1));
        Self {
            overall_per_minute,
            client_per_minute: f64::from(client_per_minute.max(1)),
            buckets: Mutex::new(Buckets {
                overall: Bucket::full(overall_per_minute, Instant::now()),
                clients: HashMap::new(),
            }),
        }
    }

    /// Takes a token from both buckets, or none and says how long to wait.
    pub fn check(&self, client: IpAddr) -> Result<(), (Refused, Duration)> {
        let now = Instant::now();
        let client = bucket_key(client);
        let (overall_cap, client_cap) = (self.overall_per_minute, self.client_per_minute);
        let (overall_rate, client_rate) = (overall_cap / 60.0, client_cap / 60.0);
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        b.overall.refill(overall_cap, overall_rate, now);
        if !b.clients.contains_key(&client) && b.clients.len() >= MAX_CLIENTS {
            b.clients.retain(|_, c| {
                c.refill(client_cap, client_rate, now);
                c.tokens < client_cap
            });
            if b.clients.len() >= MAX_CLIENTS {
                return Err((Refused::Client, Duration::from_secs(1)));
            }
        }
        let Buckets { overall, clients } = &mut *b;
        let mine = clients
            .entry(client)
            .or_insert_with(|| Bucket::full(client_cap, now));
        mine.refill(client_cap, client_rate, now);
        let (wait_overall, wait_client) = (overall.wait(overall_rate), mine.wait(client_rate));
        if wait_client > Duration::ZERO {
            return Err((Refused::Client, wait_client.max(wait_overall)));
        }
        if wait_overall > Duration::ZERO {
            return Err((Refused::Overall, wait_overall));
        }
        overall.tokens -= 1.0;
        mine.tokens -= 1.0;
        Ok(())
    }
}

/// One bucket per IPv4 address and per IPv6 /64 (what one host gets).
fn bucket_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[tokio::test(start_paused = true)]
    async fn each_client_gets_its_share_and_all_together_the_overall_one() {
        let l = Limiter::new(6, 2);
        assert!(l.check(ip("192.0.2.1")).is_ok());
        assert!(l.check(ip("192.0.2.1")).is_ok());
        let (why, wait) = l.check(ip("192.0.2.1")).expect_err("third in a minute");
        assert_eq!(why, Refused::Client);
        assert!(
            (wait.as_secs_f64() - 30.0).abs() < 1e-6,
            "one token every 30 s: {wait:?}"
        );
        for i in 2..6 {
            assert!(l.check(ip(&format!("192.0.2.{i}"))).is_ok(), "client {i}");
        }
        let (why, wait) = l.check(ip("192.0.2.9")).expect_err("six in a minute");
        assert_eq!(why, Refused::Overall);
        assert!((wait.as_secs_f64() - 10.0).abs() < 1e-6, "{wait:?}");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(l.check(ip("192.0.2.9")).is_ok(), "refilled");
        assert!(l.check(ip("192.0.2.10")).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_request_takes_no_token() {
        let l = Limiter::new(1, 1);
        assert!(l.check(ip("192.0.2.1")).is_ok());
        for _ in 0..5 {
            assert!(l.check(ip("192.0.2.2")).is_err());
        }
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(
            l.check(ip("192.0.2.2")).is_ok(),
            "its own bucket is still full"
        );
    }

    #[test]
    fn ipv6_hosts_share_a_bucket_per_64() {
        assert_eq!(bucket_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(bucket_key(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(bucket_key(ip("192.0.2.7")), ip("192.0.2.7"));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_clients_are_forgotten_when_the_table_is_full() {
        let l = Limiter::new(60_000, 1);
        for i in 0..MAX_CLIENTS as u32 {
            let a = std::net::Ipv4Addr::from(0x0a00_0000 + i);
            assert!(l.check(IpAddr::V4(a)).is_ok());
        }
        // Every client has spent its token: none can be forgotten yet.
        assert_eq!(
            l.check(ip("192.0.2.1")).map_err(|e| e.0),
            Err(Refused::Client)
        );
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(l.check(ip("192.0.2.1")).is_ok());
    }
}
