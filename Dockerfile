# The GPU spatial exporter. NVML comes from the host driver (NVIDIA container toolkit: the
# compose file reserves the GPUs); nsys, when wanted for --nsys-live, is mounted from the host.
FROM python:3.12-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/gpu-spatial-exporter
COPY pyproject.toml README.md ./
COPY exporter ./exporter
COPY hostio ./hostio
COPY nsys_ingest ./nsys_ingest
COPY gpu_trace ./gpu_trace
COPY dashboards ./dashboards
COPY setup.py ./
# gcc only to build the native tracer (gpu_trace/native), which the client pods get from this image
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install . && python -c "import gpu_trace.native as n; assert n.library_path(), 'native tracer not built'" \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home exporter
USER exporter
EXPOSE 9478
HEALTHCHECK --interval=15s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9478/healthz', timeout=2).status == 200 else 1)"
ENTRYPOINT ["python", "-m", "exporter"]
CMD ["--listen-address", "0.0.0.0"]
