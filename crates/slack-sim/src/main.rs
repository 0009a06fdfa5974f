use clap::Parser;

/// Run the Slack emulator.
#[derive(Parser)]
#[command(
    name = "threadline-slack-sim",
    version,
    about = "A Slack emulator: Events API delivery, Web API, faults"
)]
struct Args {
    /// Listen address; point SLACK_API_URL at http://<addr>/api/.
    #[arg(long, env = "SLACK_SIM_ADDR", default_value = "127.0.0.1:4000")]
    addr: std::net::SocketAddr,
    /// Seed for ids and fault dice: the same scenario replays the same way.
    #[arg(long, env = "SLACK_SIM_SEED", default_value_t = 1)]
    seed: u64,
    /// Multiplier of Slack's retry delays (1 minute, 5 minutes).
    #[arg(long, env = "SLACK_SIM_TIME_SCALE", default_value_t = 1.0)]
    time_scale: f64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let sim = threadline_slack_sim::Sim::new(args.seed);
    sim.lock().settings.time_scale = args.time_scale;
    let listener = match tokio::net::TcpListener::bind(args.addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("threadline-slack-sim: error: binding {}: {e}", args.addr);
            return std::process::ExitCode::FAILURE;
        }
    };
    eprintln!(
        "threadline-slack-sim listening on http://{} (Web API at /api/, control at /_sim/)",
        args.addr
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match threadline_slack_sim::run(sim, listener, shutdown).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("threadline-slack-sim: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
