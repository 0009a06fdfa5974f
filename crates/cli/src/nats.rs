//! `threadline nats`: the broker's half of the bus's trust boundary. The
//! users and permissions nats-server enforces are rendered from the code
//! (`threadline_runtime::nats_auth`), never written by hand.

use clap::{Subcommand, ValueEnum};
use threadline_runtime::bus::Topology;
use threadline_runtime::config::{CommonConfig, Source};
use threadline_runtime::nats_auth::{self, Format, Role};

#[derive(Subcommand)]
pub enum NatsCommand {
    /// Print nats-server's `authorization` block: one user per role with
    /// the permissions the code derives from the bus topology. Passwords
    /// are not in it: nats-server reads them from its environment
    /// (NATS_PASSWORD_GATEWAY, NATS_PASSWORD_RELAY, …).
    Auth {
        /// Bus prefix of the subjects and streams (default:
        /// THREADLINE_BUS_PREFIX, else tl).
        #[arg(long)]
        prefix: Option<String>,
        /// `conf`: nats-server configuration; `helm`: JSON for the NATS Helm
        /// chart's `config.merge`.
        #[arg(long, value_enum, default_value_t = FormatArg::Conf)]
        format: FormatArg,
    },
    /// Print a new random password for every user, as
    /// `NATS_PASSWORD_<USER>=…` lines: the environment of nats-server and
    /// the Secret the services read theirs from.
    Passwords,
    /// Create or update every stream and consumer of the bus, as the user
    /// of NATS_USER (operator or relay on a broker with authorization).
    Declare,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum FormatArg {
    Conf,
    Helm,
}

pub async fn run(command: NatsCommand, src: &Source) -> anyhow::Result<()> {
    match command {
        NatsCommand::Auth { prefix, format } => {
            let prefix = prefix.unwrap_or_else(|| src.string("THREADLINE_BUS_PREFIX", "tl"));
            // The prefix alone, checked as the services check it.
            let common = CommonConfig::from_source(
                &Source::default().with("THREADLINE_BUS_PREFIX", prefix.as_str()),
            )?;
            let format = match format {
                FormatArg::Conf => Format::Conf,
                FormatArg::Helm => Format::Helm,
            };
            print!(
                "{}",
                nats_auth::render(&Topology::new(common.bus_prefix), format)
            );
        }
        NatsCommand::Passwords => {
            for role in Role::ALL {
                println!(
                    "{}={}",
                    role.password_variable(),
                    nats_auth::generate_password()
                );
            }
        }
        NatsCommand::Declare => {
            let common = CommonConfig::from_source(src)?;
            if let Some(role) = common.nats_url.role().filter(|r| !r.declares()) {
                anyhow::bail!(
                    "the NATS user {role} may not declare the bus: run this as the user operator"
                );
            }
            let nats = threadline_runtime::bus::connect(&common.nats_url, "threadline-cli").await?;
            let js = async_nats::jetstream::new(nats.clone());
            let topology = Topology::from_config(&common);
            topology.declare_all(&js).await?;
            nats.flush().await?;
            println!(
                "declared the streams and consumers of prefix {}",
                topology.prefix()
            );
        }
    }
    Ok(())
}
