# One image for every Claw-R1 role; docker-compose.yml picks the role with the `clawr1` command.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY clawr1 clawr1
COPY broker broker
COPY schemas schemas
COPY proxy proxy
COPY gateway gateway
COPY streams streams
COPY sinks sinks
COPY pool pool
COPY consumer_sdk consumer_sdk
COPY prefix_tree prefix_tree
COPY dashboard dashboard
COPY demo demo
COPY compat compat
COPY rewards rewards
RUN pip install --no-cache-dir --prefer-binary -c constraints.txt '.[all,tokenizer]'
ENV CLAWR1_DATA_DIR=/data
VOLUME ["/data"]
ENTRYPOINT ["clawr1"]
