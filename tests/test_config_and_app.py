"""Flags and their environment variables; the scrape path renders once per snapshot."""
import pytest

from exporter.app import MetricsCache, build_registry
from exporter.config import build_parser, parse_args
from exporter.engine import Engine
from exporter.nvml_replay import ReplayNvml
from exporter.samplers.gpm import GpmSource
from exporter.samplers.nvml import NvmlSampler
from tests.helpers import FIXTURES


def test_defaults_listen_on_loopback_off_the_dcgm_and_node_exporter_ports():
    args = parse_args([])
    assert args.listen_address == "127.0.0.1" and args.port not in (9400, 9100)
    assert args.interval == 1.0 and args.spatial_sources == ("dcgm", "gpm", "nsys")


def test_flags_read_environment_variables(monkeypatch):
    monkeypatch.setenv("GPU_EXPORTER_INTERVAL", "0.5")
    monkeypatch.setenv("GPU_EXPORTER_SPATIAL_SOURCES", "gpm,nsys")
    monkeypatch.setenv("GPU_EXPORTER_NO_MPS", "true")
    args = parse_args([])
    assert args.interval == 0.5 and args.spatial_sources == ("gpm", "nsys") and args.no_mps
    assert parse_args(["--interval", "2"]).interval == 2.0  # the flag wins over the environment


@pytest.mark.parametrize("argv", [["--interval", "0.05"], ["--spatial-sources", "gpm,cuda"],
                                  ["--spatial-sources", "gpm,gpm"]])
def test_bad_flags_are_refused(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_help_names_every_flag_and_its_environment_variable():
    text = build_parser().format_help()
    for action in build_parser()._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag not in ("--help", "--version"):  # no environment for these
                assert flag in text
                assert "GPU_EXPORTER_" + flag[2:].replace("-", "_").upper() in text


def test_metrics_are_rendered_once_per_snapshot():
    backend = ReplayNvml(FIXTURES / "nvml_h100_quarter_sms_frame.json")
    nvml = NvmlSampler(backend, interval=0.5)
    engine = Engine(nvml, [GpmSource(nvml)], interval=0.5)
    engine.tick_devices()
    engine.publish()
    cache = MetricsCache(engine, build_registry(engine))
    first = cache.render()
    assert cache.render() is first  # same snapshot: the same bytes, no collect()
    engine.publish()
    assert cache.render() is not first
