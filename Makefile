# The two commands a newcomer needs are `make run` and `make test`; both do their own set-up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
KAFKA_LIB := $(CURDIR)/.cache/kafka/lib

.PHONY: install chromium run test lint bench clean

install: $(VENV)/.installed $(KAFKA_LIB)/.resolved chromium

# Debian's Chromium for the dashboard's browser tests (Playwright drives it; no browser download).
# Installed only when missing and running as root; otherwise those tests say what to install.
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update && apt-get install -y chromium; } \
		|| echo "chromium is missing: run 'apt-get install -y chromium' as root for the dashboard's browser tests"

# Idempotent: re-runs only when the dependency files change.
$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --prefer-binary -c constraints.txt -e '.[all,test,tokenizer,demo]'
	touch $@

# Apache Kafka (KRaft) jars from Maven Central, as pinned in broker/pom.xml.
$(KAFKA_LIB)/.resolved: broker/pom.xml
	@command -v java >/dev/null || { echo "java (JDK 17+) is required to run Kafka"; exit 1; }
	@command -v mvn >/dev/null || { echo "maven is required to resolve Kafka from Maven Central"; exit 1; }
	mvn -q -B -f broker/pom.xml -Dkafka.lib.dir=$(KAFKA_LIB) dependency:copy-dependencies
	touch $@

run: install
	$(BIN)/clawr1 up --demo

# Two processes: the integration tests in order on one, the unit tests on the other (tests/conftest.py).
test: install
	$(BIN)/ruff check .
	@# mypy checks beside pytest (one core's work for ~30 s, while the integration tests mostly wait);
	@# either failing fails the target.
	$(BIN)/mypy & mypy=$$!; $(BIN)/python -m pytest -n 2; tests=$$?; wait $$mypy && exit $$tests

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: install
	for b in bench/bench_*.py; do $(BIN)/python -m bench.$$(basename $$b .py) || exit 1; done

clean:
	rm -rf $(VENV) .cache .clawr1 .pytest_cache
