"""Timeline plot: time utilization (GR active) against spatial utilization, one panel per GPU."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt

from nsys_ingest.analysis import bucket_means
from nsys_ingest.reader import Export, IngestError

MAX_POINTS = 1200


def check_output(path: str) -> None:
    """The file's suffix chooses the image format: one matplotlib cannot write is refused by name."""
    formats = sorted(plt.figure().canvas.get_supported_filetypes())
    plt.close("all")
    suffix = path.rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
    if suffix not in formats:
        said = f"no .{suffix} files" if suffix else "no file without a suffix"
        raise IngestError(f"cannot write {path}: plot writes images, {said}; its suffix chooses the format, one "
                          f"of {', '.join('.' + f for f in formats)} (e.g. -o timeline.png)")


def figure(export: Export, start_ns=None, end_ns=None, chunk_rows=None, progress=None):
    """The figure: one panel per GPU, its legend outside the panel, right of it (the lines reach 1.0,
    where a legend inside would cover them). Raises IngestError when the window holds no sample."""
    low, high = export.time_range()
    low, high = max(low, start_ns or low), min(high, end_ns or high)
    step = max((high - low) / 1e9 / MAX_POINTS, 1.0 / (export.sampling_hz or 1000))
    kwargs = {"chunk_rows": chunk_rows} if chunk_rows else {}
    buckets = bucket_means(export, step, start_ns=start_ns, end_ns=end_ns, progress=progress, **kwargs)
    if not len(buckets):
        raise export.empty_window(start_ns, end_ns)
    gpus = sorted(buckets["gpu"].unique())
    fig, axes = plt.subplots(len(gpus), 1, figsize=(12.5, 3.2 * len(gpus)), sharex=True, squeeze=False)
    for ax, gpu in zip(axes[:, 0], gpus):
        rows = buckets[buckets["gpu"] == gpu]
        t = rows["bucket"]
        info = export.gpus.get(int(gpu))
        if "gr_active" in rows and "sm_active" in rows:
            ax.fill_between(t, rows["sm_active"], rows["gr_active"], where=rows["gr_active"] > rows["sm_active"],
                            color="tab:red", alpha=0.15, label="hidden idle SMs", step="post")
        for column, color, label, width in (("gr_active", "black", "time: GR active", 2.0),
                                            ("sm_active", "tab:blue", "space: SM active", 2.0),
                                            ("sm_occupancy", "tab:green", "SM occupancy", 1.2),
                                            ("tensor_active", "tab:orange", "tensor active", 1.2)):
            if column in rows:
                ax.step(t, rows[column], where="post", color=color, label=label, linewidth=width)
        ax.set_ylim(-0.02, 1.05)
        ax.set_ylabel("ratio")
        ax.set_title(f"GPU {gpu}: {info.name if info else ''}", loc="left", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)
    axes[-1, 0].set_xlabel("seconds from capture start")
    fig.suptitle(f"{export.source_path.name}: time vs spatial utilization", fontsize=11)
    fig.tight_layout()
    return fig


def plot(export: Export, output, start_ns=None, end_ns=None, chunk_rows=None, progress=None) -> None:
    fig = figure(export, start_ns, end_ns, chunk_rows, progress)
    try:
        fig.savefig(output, dpi=110)
    finally:
        plt.close(fig)
