//! A private `nats-server -js` whose store survives restarts, so a test can
//! take the broker away and bring it back (the machine's shared server is
//! never touched); optionally with the authorization `threadline nats auth`
//! renders, each role logging in with its own password.

use std::process::Stdio;
use std::time::Duration;

use threadline_runtime::nats_auth::Role;
use threadline_testkit::eventually;
use tokio::process::{Child, Command};

use crate::free_port;

pub struct Broker {
    pub port: u16,
    dir: std::path::PathBuf,
    child: Option<Child>,
    logins: Option<Logins>,
}

/// The users of a broker with authorization: each role's password.
#[derive(Debug, Clone)]
pub struct Logins {
    /// The bus prefix the permissions are for.
    prefix: String,
    passwords: Vec<(Role, String)>,
}

impl Logins {
    /// The bus prefix the users' permissions are for.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn password(&self, role: Role) -> String {
        self.passwords
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, p)| p.clone())
            .expect("every role has a password")
    }

    /// The settings that make a threadline process log in as `role`.
    pub fn env(&self, role: Role) -> Vec<(&'static str, String)> {
        vec![
            ("NATS_USER", role.user().to_owned()),
            ("NATS_PASSWORD", self.password(role)),
        ]
    }
}

impl Broker {
    pub async fn start() -> Self {
        Self::start_as(None).await
    }

    /// A broker that admits only threadline's users, with the permissions
    /// `threadline nats auth --prefix <prefix>` renders from the code and
    /// passwords from `threadline nats passwords`.
    pub async fn start_with_authorization(prefix: &str) -> Self {
        let out = crate::cli(&["nats", "passwords"], &[]).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("utf-8");
        let passwords: Vec<(Role, String)> = Role::ALL
            .into_iter()
            .map(|role| {
                let line = text
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{}=", role.password_variable())))
                    .unwrap_or_else(|| panic!("no password for {role}"));
                (role, line.to_owned())
            })
            .collect();
        Self::start_as(Some(Logins {
            prefix: prefix.to_owned(),
            passwords,
        }))
        .await
    }

    async fn start_as(logins: Option<Logins>) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("threadline-broker-{port}-{}", std::process::id()));
        let mut b = Self {
            port,
            dir,
            child: None,
            logins,
        };
        b.up().await;
        b
    }

    /// The passwords of its users, when it has authorization.
    pub fn logins(&self) -> Option<&Logins> {
        self.logins.as_ref()
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on its port with its store.
    pub async fn up(&mut self) {
        let mut cmd = Command::new("nats-server");
        cmd.args([
            "-a",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-js",
            "-sd",
        ])
        .arg(&self.dir);
        if let Some(logins) = &self.logins {
            let out = crate::cli(&["nats", "auth", "--prefix", &logins.prefix], &[]).await;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::create_dir_all(&self.dir).expect("broker dir");
            let conf = self.dir.join("authorization.conf");
            std::fs::write(&conf, out.stdout).expect("writing the broker's configuration");
            cmd.arg("-c").arg(&conf);
            for (role, password) in &logins.passwords {
                cmd.env(role.password_variable(), password);
            }
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server (apt-get install nats-server)");
        self.child = Some(child);
        let url = self.url();
        let login = self
            .logins
            .as_ref()
            .map(|l| (Role::Operator.user().to_owned(), l.password(Role::Operator)));
        eventually("the broker", Duration::from_secs(20), || {
            let (url, login) = (url.clone(), login.clone());
            async move {
                let mut options = async_nats::ConnectOptions::new();
                if let Some((user, password)) = login {
                    options = options.user_and_password(user, password);
                }
                options.connect(url).await.ok().map(|_| ())
            }
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
