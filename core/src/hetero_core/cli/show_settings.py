"""``hetero settings``: the effective settings (flags over ``HETERO_*`` over ``--config`` over defaults)
and, for each seam, the component chosen and the plugin that supplies it. Loads no model."""

from __future__ import annotations

import argparse
import json

from hetero_core.cli.settings_args import add_settings_arguments, load_cli_settings


def add_settings_command(commands, *, with_arguments: bool = True) -> None:
    settings = commands.add_parser("settings", help="print the effective settings and who supplies each seam")
    if with_arguments:
        settings.add_argument("--json", action="store_true", help="machine-readable output")
        add_settings_arguments(settings)
    settings.set_defaults(handler=settings_command)


def settings_command(args: argparse.Namespace) -> int:
    from hetero_core.builder import check_allow_list, executor_section
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.plugin_system.seams import SEAM_TABLE

    settings = load_cli_settings(args)
    plugin_set = load_plugins(allow=settings.plugins)
    check_allow_list(settings.plugins, plugin_set)
    dists = {p.name: (p.distribution, p.version) for p in plugin_set.plugins}
    seams = {}
    for seam in SEAM_TABLE:
        name = settings.component_name(seam.name)
        if seam.name == "tokenizer" and name == "auto":
            seams[seam.name] = {
                "name": "auto",
                "plugin": "core",
                "note": "hf with a real model, byte otherwise",
            }
            continue
        try:
            component = plugin_set.registry.get(seam.name, name)
        except Exception as exc:  # shown, not raised: the point is to see what is wrong
            seams[seam.name] = {"name": name, "plugin": None, "note": str(exc)}
            continue
        dist, version = dists.get(component.plugin, (None, None))
        section = getattr(settings, seam.name).section(name)
        if seam.name == "executor":  # as the builder applies them
            section = executor_section(component, settings, section)
        options = component.validate_options(section)
        seams[seam.name] = {
            "name": name,
            "plugin": component.plugin,
            "distribution": dist,
            "version": version,
            "options": json.loads(options.model_dump_json()) if options is not None else None,
        }
        if seam.name == "executor" and (seams[seam.name]["options"] or {}).get("dtype") == "auto":
            seams[seam.name]["dtype"] = auto_dtype(name, seams[seam.name]["options"])
    values = json.loads(settings.model_dump_json())
    if args.json:
        print(json.dumps({"seams": seams, "settings": values}, indent=2))
        return 0
    print("seams:")
    for seam, info in seams.items():
        where = f"{info['plugin']}" + (
            f" ({info['distribution']} {info['version']})" if info.get("distribution") else ""
        )
        note = f"  # {info['note']}" if info.get("note") else ""
        print(f"  {seam} = {info['name']}: {where if info['plugin'] else 'unavailable'}{note}")
        for key, value in (info.get("options") or {}).items():
            resolved = f"  # {info['dtype']}" if key == "dtype" and info.get("dtype") else ""
            print(f"    {key} = {json.dumps(value)}{resolved}")
    print("settings:")
    for key, value in values.items():
        if key not in seams:
            print(f"  {key} = {json.dumps(value)}")
    return 0


def auto_dtype(executor: str, options: dict) -> str:
    """What ``dtype = "auto"`` becomes, where that is known without starting the executor: the torch
    executor on a CPU without native bf16 has no other candidate than float32 (``torch_auto_dtype``)."""
    from hetero_core.model.cpu.cpu_info import NATIVE_BF16_CPU_FLAGS, cpu_flags

    if (
        executor == "torch"
        and options.get("device") == "cpu"
        and not cpu_flags().intersection(NATIVE_BF16_CPU_FLAGS)
    ):
        return f"float32: this CPU has no native bf16 ({' / '.join(NATIVE_BF16_CPU_FLAGS)})"
    return (
        "decided when the executor starts (torch on a CPU: float32 or bfloat16, whichever runs the "
        "model's own steps faster, timed once and kept in cpu_dtype_choice.json)"
        if executor == "torch"
        else "decided when the executor starts"
    )
