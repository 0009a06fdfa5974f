//! A private `nats-server -js` whose store survives restarts, so a test can
//! take the broker away and bring it back (the machine's shared server is
//! never touched).

use std::process::Stdio;
use std::time::Duration;

use threadline_testkit::eventually;
use tokio::process::{Child, Command};

use crate::free_port;

pub struct Broker {
    pub port: u16,
    dir: std::path::PathBuf,
    child: Option<Child>,
}

impl Broker {
    pub async fn start() -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("threadline-broker-{port}-{}", std::process::id()));
        let mut b = Self {
            port,
            dir,
            child: None,
        };
        b.up().await;
        b
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on its port with its store.
    pub async fn up(&mut self) {
        let child = Command::new("nats-server")
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server (apt-get install nats-server)");
        self.child = Some(child);
        let url = self.url();
        eventually("the broker", Duration::from_secs(20), || {
            let url = url.clone();
            async move { async_nats::connect(url).await.ok().map(|_| ()) }
        })
        .await;
    }

    /// Kills the server: every client loses its connection at once.
    pub async fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().await.expect("kill nats-server");
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
