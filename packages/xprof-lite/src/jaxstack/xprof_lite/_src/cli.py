"""`jaxstack-prof`: reports and exports from a captured logdir, and the device peak.

jaxstack-prof report LOGDIR [--out DIR] [--peak-flops F --peak-bandwidth B]
jaxstack-prof export LOGDIR [--out trace.json]      # Chrome/Perfetto trace JSON
jaxstack-prof peak [--refresh]                      # spec or measured FLOP/s and bytes/s
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxstack.xprof_lite._src.errors import Error


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxstack-prof", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="HTML + Markdown report of a captured logdir")
    rep.add_argument("logdir")
    rep.add_argument("--out", help="output directory (default: the logdir)")
    rep.add_argument("--peak-flops", type=float, help="device peak FLOP/s (default: measured)")
    rep.add_argument("--peak-bandwidth", type=float, help="device peak bytes/s")
    exp = sub.add_parser("export", help="write the newest run as Chrome/Perfetto trace JSON")
    exp.add_argument("logdir")
    exp.add_argument("--out", help="target .json file (default: <run>/trace.json)")
    peak = sub.add_parser("peak", help="print the device peak used for rooflines")
    peak.add_argument("--refresh", action="store_true", help="measure again (CPU)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # JAX and the report's libraries load only for the command that runs: --help answers at once.
    from jaxstack.xprof_lite._src import tracefile
    from jaxstack.xprof_lite._src.capture import export_chrome_trace
    from jaxstack.xprof_lite._src.peak import DevicePeak, device_peak
    from jaxstack.xprof_lite._src.report import report_logdir

    try:
        if args.command == "report":
            peak = None
            if (args.peak_flops is None) != (args.peak_bandwidth is None):
                raise Error("give both --peak-flops and --peak-bandwidth, or neither")
            if args.peak_flops is not None:
                peak = DevicePeak("given", args.peak_flops, args.peak_bandwidth)
            paths = report_logdir(args.logdir, args.out, peak=peak)
            print(json.dumps({k: str(v) for k, v in paths.items()}, indent=1))
        elif args.command == "export":
            run = tracefile.find_xplane(args.logdir).parent
            target = export_chrome_trace(run, Path(args.out) if args.out else None)
            if target is None:
                raise Error(f"no *.trace.json.gz in {str(run)!r} to export")
            print(target)
        else:
            print(json.dumps(device_peak(refresh=args.refresh).to_dict(), indent=1))
    except Error as exc:
        print(f"jaxstack-prof: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
