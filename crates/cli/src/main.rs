//! `threadline`: operator commands.

use clap::{Parser, Subcommand};

mod dlq;
mod events;
mod feedback;
mod install;
mod intents;
mod keys;
mod nats;
mod operator;
mod policy;
mod purge;
mod review;
mod stats;
mod switches;

#[derive(Parser)]
#[command(
    name = "threadline",
    version,
    about = "Operate threadline: schema, installations, ledger figures"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply pending database migrations (idempotent).
    Migrate,
    /// Manage Slack installations.
    Install {
        #[command(subcommand)]
        command: install::InstallCommand,
    },
    /// Ledger figures from the database.
    Stats {
        /// Print one JSON object (the only format for now).
        #[arg(long)]
        json: bool,
    },
    /// Reply intents: settle the ones held for an operator.
    Intents {
        #[command(subcommand)]
        command: intents::IntentsCommand,
    },
    /// What may trigger an answer: DMs, private and shared channels, bots, channel modes.
    Policy {
        #[command(subcommand)]
        command: policy::PolicyCommand,
    },
    /// Proposals waiting for human review.
    Review {
        #[command(subcommand)]
        command: review::ReviewCommand,
    },
    /// Feedback on answers: export the verdicts people gave with the buttons.
    Feedback {
        #[command(subcommand)]
        command: feedback::FeedbackCommand,
    },
    /// Kill switches: stop model calls and posts at run time.
    #[command(name = "kill-switch")]
    KillSwitch {
        #[command(subcommand)]
        command: switches::SwitchCommand,
    },
    /// Deliveries held as `unparsed`: list them, replay them after an upgrade.
    Events {
        #[command(subcommand)]
        command: events::EventsCommand,
    },
    /// Dead letters: list, replay onto their subject, or drop.
    Dlq {
        #[command(subcommand)]
        command: dlq::DlqCommand,
    },
    /// Delete what is past its retention: audit records, finished receipts
    /// and the text of idle threads.
    Purge(purge::PurgeArgs),
    /// The broker's users and permissions, rendered from the code; declaring the bus.
    Nats {
        #[command(subcommand)]
        command: nats::NatsCommand,
    },
    /// Token-encryption keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Print a new X25519 private key entry for THREADLINE_TOKEN_KEYS
    /// (`id:x25519:hex64`); `keys public` prints its public half.
    Generate {
        /// Key id stored with every ciphertext sealed to it.
        #[arg(long, default_value = "k1")]
        id: String,
        /// A symmetric key (`id:hex64`) instead, for
        /// THREADLINE_DEAD_LETTER_KEYS.
        #[arg(long)]
        symmetric: bool,
    },
    /// Print THREADLINE_TOKEN_PUBLIC_KEYS (the gateway's) for the X25519
    /// keys of THREADLINE_TOKEN_KEYS, in the same order.
    Public,
    /// Re-seal every stored token to the first key of THREADLINE_TOKEN_KEYS,
    /// an X25519 key (list the old keys after it until this has run).
    Rotate,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    threadline_runtime::exit_with("threadline", run(cli).await)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let src = threadline_runtime::config::Source::from_env()?;
    threadline_runtime::audit::configure(&src)?;
    match cli.command {
        Command::Migrate => {
            let common = threadline_runtime::config::CommonConfig::from_source(&src)?;
            let pool = threadline_runtime::db::connect(&common).await?;
            let applied =
                threadline_runtime::db::migrate(&pool, &threadline_store::schema::MIGRATOR).await?;
            println!("migrations applied: {applied} (schema is current)");
        }
        Command::Install { command } => install::run(command, &src, &pool(&src).await?).await?,
        Command::Stats { json: _ } => {
            // The spool first: during a Postgres outage it is what there
            // is to see.
            let common = threadline_runtime::config::CommonConfig::from_source(&src)?;
            let spool = stats::spool(&common).await;
            let ledger = match pool(&src).await {
                Ok(pool) => stats::collect(&pool).await,
                Err(e) => Err(e),
            };
            let mut s = match ledger {
                Ok(s) => s,
                Err(e) => {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&serde_json::json!({"spool": spool}))?
                    );
                    return Err(e);
                }
            };
            s["spool"] = spool;
            println!("{}", serde_json::to_string_pretty(&s)?);
        }
        Command::Intents { command } => {
            let common = threadline_runtime::config::CommonConfig::from_source(&src)?;
            intents::run(command, &common, &pool(&src).await?).await?
        }
        Command::Policy { command } => policy::run(command, &pool(&src).await?).await?,
        Command::Review { command } => {
            let common = threadline_runtime::config::CommonConfig::from_source(&src)?;
            review::run(command, &common, &pool(&src).await?).await?
        }
        Command::Feedback { command } => feedback::run(command, &pool(&src).await?).await?,
        Command::KillSwitch { command } => switches::run(command, &pool(&src).await?).await?,
        Command::Events { command } => events::run(command, &pool(&src).await?).await?,
        Command::Dlq { command } => {
            let common = threadline_runtime::config::CommonConfig::from_source(&src)?;
            dlq::run(command, &common).await?
        }
        Command::Purge(args) => {
            let mut report = purge::run(&args, &src, &pool(&src).await?).await?;
            let common = threadline_runtime::config::CommonConfig::from_source(&src)?;
            let letters = purge::dead_letters(&args, &common, &mut report).await;
            println!("{}", serde_json::to_string_pretty(&report)?);
            anyhow::Context::context(letters, "the database is purged; the dead letters are not")?;
        }
        Command::Nats { command } => nats::run(command, &src).await?,
        Command::Keys {
            command: KeysCommand::Rotate,
        } => keys::rotate(&src, &pool(&src).await?).await?,
        Command::Keys {
            command: KeysCommand::Generate { id, symmetric },
        } => {
            use threadline_tenancy::secrets::{SymmetricKeys, TokenKeys};
            if symmetric {
                println!("{}", SymmetricKeys::generate_entry(&id));
            } else {
                println!("{}", TokenKeys::generate_entry(&id));
            }
        }
        Command::Keys {
            command: KeysCommand::Public,
        } => keys::public(&src)?,
    }
    Ok(())
}

/// A connected pool on a schema this CLI knows: like the services, every
/// command but `migrate` refuses a database whose schema is behind it.
async fn pool(src: &threadline_runtime::config::Source) -> anyhow::Result<sqlx::PgPool> {
    let common = threadline_runtime::config::CommonConfig::from_source(src)?;
    let pool = threadline_runtime::db::connect(&common).await?;
    threadline_runtime::db::ensure_schema_current(&pool, &threadline_store::schema::MIGRATOR)
        .await?;
    Ok(pool)
}
