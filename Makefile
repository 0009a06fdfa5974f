# threadline — every target CI runs is here; `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

TL_PG_PORT ?= 5432
TL_NATS_PORT ?= 4222
export TL_PG_PORT TL_NATS_PORT
export DATABASE_URL ?= postgres://postgres@127.0.0.1:$(TL_PG_PORT)/threadline
export NATS_URL ?= nats://127.0.0.1:$(TL_NATS_PORT)
export THREADLINE_TEST_ADMIN_URL ?= postgres://postgres@127.0.0.1:$(TL_PG_PORT)/postgres
# Statements are checked against the committed offline data, never against
# the database DATABASE_URL names (scripts/sqlx-prepare.sh goes online).
export SQLX_OFFLINE ?= true

NEXTEST := $(shell command -v cargo-nextest >/dev/null 2>&1 && echo yes)
RELEASE_BIN = $(or $(CARGO_TARGET_DIR),target)/release

.PHONY: help
help: ## List targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-16s %s\n", $$1, $$2}'

.PHONY: demo
demo: ## Build, start what is missing, play a scripted Slack story and report (ARGS=--keep-running to explore; ARGS=--real-model: one question answered by a real model)
	./scripts/with-services.sh ./scripts/demo.sh $(ARGS)

.PHONY: chaos
chaos: ## Adversarial chaos soak judged from Slack's side: random activity, faults, kills, pauses, Postgres and NATS outages (ARGS="--events N --seed N")
	./scripts/with-services.sh bash -c 'cargo build --workspace --bins && "$${CARGO_TARGET_DIR:-target}/debug/threadline-chaos" $(ARGS)'

CAMPAIGN_RUNS ?= 20
CAMPAIGN_EVENTS ?= 300
CAMPAIGN_SEED ?= $(shell date +%s)

.PHONY: chaos-campaign
chaos-campaign: ## Many short soaks, each with the full fault mix on a fresh stack and judged from Slack's side; a table of every seed's verdict (20 seeds x 300 events: about 45 min on 2 cores; CAMPAIGN_RUNS, CAMPAIGN_EVENTS, CAMPAIGN_SEED)
	./scripts/with-services.sh bash -c 'cargo build --workspace --bins && "$${CARGO_TARGET_DIR:-target}/debug/threadline-chaos" --runs $(CAMPAIGN_RUNS) --events $(CAMPAIGN_EVENTS) --seed $(CAMPAIGN_SEED)'

.PHONY: test
test: deploy-check ## Lint, check the deployment, build, run unit, integration and end-to-end tests (starts Postgres/NATS if absent), then the container smoke test
	./scripts/with-services.sh $(MAKE) --no-print-directory lint test-only image-smoke-only

.PHONY: test-only
test-only: ## Run the tests against already reachable services
	cargo build --workspace --bins
ifeq ($(NEXTEST),yes)
	cargo nextest run --workspace --profile ci
else
	THREADLINE_LOG_RUN="test-$$(date +%Y%m%dT%H%M%S)-$$$$" cargo test --workspace
endif
	./scripts/sdk-check.sh
	./scripts/real-model-check.sh

.PHONY: real-model-check
real-model-check: ## End-to-end tests with a real model: llama.cpp's OpenAI-compatible server (xllamacpp) serving SmolLM2-135M-Instruct, installed once into a cached virtualenv
	cargo build --workspace --bins
	./scripts/with-services.sh ./scripts/real-model-check.sh

.PHONY: sdk-check
sdk-check: ## slack-sim checked by Slack's own Python SDK (slack_sdk: WebClient, chat_stream, SignatureVerifier)
	cargo build -p threadline-slack-sim
	./scripts/sdk-check.sh

.PHONY: images
images: ## Container images of the services and the CLI (threadline-<name>:dev and :<version>); ARGS=--from-source uses deploy/Dockerfile's build stage
	./scripts/images.sh $(ARGS)

.PHONY: image-smoke
image-smoke: ## Build the images and run every service in a container: probes, non-root, read-only root, one mention answered through slack-sim (starts Docker, Postgres, NATS if absent)
	./scripts/with-services.sh ./scripts/image-smoke.sh

.PHONY: image-smoke-only
image-smoke-only:
	./scripts/image-smoke.sh

.PHONY: lint
lint: ## Docs against the code (settings, links, invariants, commit subjects; scripts/check-docs.py), rustfmt check, the store's offline query data against the migrations and each service's statements against its role's grants (needs Postgres), clippy with warnings denied
	python3 scripts/check-docs.py --self-test
	python3 scripts/check-docs.py
	cargo fmt --all --check
	./scripts/sqlx-prepare.sh --check
	python3 scripts/check-grants.py
	cargo clippy --workspace --all-targets -- -D warnings

.PHONY: sqlx-prepare
sqlx-prepare: ## Regenerate the store's offline query data (crates/store/.sqlx) from migrations/ (starts Postgres if absent)
	./scripts/with-services.sh ./scripts/sqlx-prepare.sh

.PHONY: deploy-check
deploy-check: ## Render every Kubernetes overlay and validate it offline against the schemas and the code; lint the Dockerfile
	./scripts/deploy-check.sh

.PHONY: fmt
fmt: ## Format the code
	cargo fmt --all

.PHONY: services
services: ## Start Postgres and NATS locally if they are not reachable
	./scripts/services.sh up

.PHONY: services-down
services-down: ## Stop what `make services` started
	./scripts/services.sh down

.PHONY: run
run: ## Run threadline locally: services, migrations, a dev installation, the gateway
	./scripts/run-local.sh

.PHONY: bench
bench: ## Benchmarks (figures, no assertions): gateway ack throughput/latency, then pipeline mention→reply latency and peak memory
	./scripts/with-services.sh ./scripts/bench-gateway.sh
	./scripts/with-services.sh ./scripts/bench-pipeline.sh $(ARGS)

.PHONY: bench-gateway
bench-gateway: ## Throughput and ack latency of the release gateway (signed deliveries, concurrency 64)
	./scripts/with-services.sh ./scripts/bench-gateway.sh
