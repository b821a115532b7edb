"""Which code location holds a harvester when a deployment is split into K shards.

A harvester belongs to shard `jump(blake2b(id), K)`: Lamping and Veach's jump consistent
hash over a 64-bit BLAKE2b digest of its id. The shard depends on the id and K alone, so
adding or removing a harvester never moves another, and going from K to K+1 shards moves
only the 1/(K+1) of harvesters that the new shard takes (the fewest any scheme can move).

A shard is named by its code location: a location whose name ends in `shard_<i>` (or
`shard-<i>`, the form Kubernetes names allow) holds shard i of K, where K is stored once
in the registry (`oaipmh-dagster workspace --shards K` writes it): names do not carry K,
so changing K renames no location and keeps the schedule states, run history and sensor
cursors Dagster keys by location name. A name ending in `shard_<i>_of_<K>` (the names
of earlier versions) still holds shard i of the K it names; any other name holds every
harvester. The same module
(`oaipmh_dagster.definitions`) serves every shard, so `workspace.yaml` entries differ
only in their location names. No Dagster import here."""

from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass
from typing import Any

import yaml

from oaipmh_dagster.errors import OAIPMHDagsterError

__all__ = ["DEFAULT_LOCATION", "MAX_SHARDS", "InvalidShard", "Shard", "ShardCountUnknown",
           "helm_user_deployments", "location_names", "parse_location", "shard_of",
           "workspace_yaml"]

DEFAULT_LOCATION = "oaipmh_dagster"
MAX_SHARDS = 1024
# `_` or `-` between the parts: Kubernetes names (the Helm chart's user deployments)
# allow no `_`.
_LEGACY = re.compile(r"(?:^|[_-])shard([_-])(0|[1-9]\d*)\1of\1(0|[1-9]\d*)$")
_SUFFIX = re.compile(r"(?:^|[_-])shard[_-](0|[1-9]\d*)$")
_MASK = (1 << 64) - 1


class InvalidShard(OAIPMHDagsterError, ValueError):
    """A location name or shard count that names no valid shard."""


class ShardCountUnknown(InvalidShard):
    """A location named `..._shard_<i>` while the registry stores no shard count."""


def parse_location(name: str | None) -> tuple[int, int | None] | None:
    """(index, K) of a shard location name: K is None for a name without it
    (`..._shard_<i>`), and the whole result None for a name that names no shard."""
    legacy = _LEGACY.search(name or "")
    if legacy:
        return int(legacy[2]), int(legacy[3])
    match = _SUFFIX.search(name or "")
    return (int(match[1]), None) if match else None


def _key(harvester_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(harvester_id.encode(), digest_size=8).digest(), "big")


def shard_of(harvester_id: str, count: int) -> int:
    """The shard (0 <= shard < count) that holds `harvester_id` (jump consistent hash)."""
    if not 1 <= count <= MAX_SHARDS:
        raise InvalidShard(f"the number of shards must be 1 to {MAX_SHARDS}, not {count}")
    key, bucket, jump = _key(harvester_id), -1, 0
    while jump < count:
        bucket = jump
        key = (key * 2862933555777941757 + 1) & _MASK
        jump = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS or not 0 <= self.index < self.count:
            raise InvalidShard(f"no shard {self.index} of {self.count}: a shard is "
                               f"shard_<i>_of_<K> with 0 <= i < K <= {MAX_SHARDS}")

    def holds(self, harvester_id: str) -> bool:
        """Whether this shard holds `harvester_id`."""
        return shard_of(harvester_id, self.count) == self.index

    def location_name(self, prefix: str = DEFAULT_LOCATION) -> str:
        """The code location name that serves this shard, `PREFIX_shard_<i>` (with `-`
        between the parts when the prefix has one: a Kubernetes-style name). It does
        not carry K."""
        sep = "-" if "-" in prefix else "_"
        return f"{prefix}{sep}shard{sep}{self.index}"

    @classmethod
    def of_location(cls, name: str | None, count: int | None = None) -> Shard | None:
        """The shard a code location named `name` serves (None: every harvester);
        `count` is the stored K, which a name without K needs (`ShardCountUnknown`
        without it). A name that carries K keeps the K it names."""
        parsed = parse_location(name)
        if parsed is None:
            return None
        index, named = parsed
        if named is not None:
            return cls(index, named)
        if count is None:
            raise ShardCountUnknown(
                f"code location {name!r} is a shard, but the registry stores no number of "
                "shards: run `oaipmh-dagster workspace --shards K`")
        return cls(index, count)


def location_names(count: int, prefix: str = DEFAULT_LOCATION) -> list[str]:
    """The names of the `count` code locations of a deployment (`prefix` alone for one)."""
    if count == 1:
        return [prefix]
    return [Shard(i, count).location_name(prefix) for i in range(count)]


def workspace_yaml(count: int, prefix: str = DEFAULT_LOCATION,
                   module: str = "oaipmh_dagster.definitions",
                   grpc_host: str | None = None, grpc_port: int | None = None) -> str:
    """A `workspace.yaml` whose `count` code locations hold every harvester exactly once:
    `python_module` entries (the webserver or `dagster dev` starts each code server), or
    with `grpc_port`, `grpc_server` entries on ports grpc_port, grpc_port + 1, ... of
    code servers started with the commands given in the file's comments."""
    names = location_names(count, prefix)
    lines = [f"# {count} code location(s) of oaipmh-dagster, each holding the harvesters of "
             "its shard", "# (written by `oaipmh-dagster workspace`)."]
    if grpc_port is None:
        lines.append("load_from:")
        for name in names:
            lines += ["  - python_module:", f"      module_name: {module}",
                      f"      location_name: {name}"]
        return "\n".join(lines) + "\n"
    host = grpc_host or "127.0.0.1"
    lines.append("# Start one code server per location, e.g. as systemd services:")
    lines += [f"#   dagster code-server start -m {module} --location-name {name} "
              f"-h {host} -p {grpc_port + i}" for i, name in enumerate(names)]
    lines.append("load_from:")
    for i, name in enumerate(names):
        lines += ["  - grpc_server:", f"      host: {host}", f"      port: {grpc_port + i}",
                  f"      location_name: {name}"]
    return "\n".join(lines) + "\n"


def helm_user_deployments(values: str, count: int, prefix: str) -> str:
    """A Helm values file for Dagster's chart whose `dagster-user-deployments` hold one
    deployment per location of `count` shards, each a copy of the first deployment in
    `values` (image, secrets, env, resources) whose code server is started under the
    deployment's name, as the chart requires. `InvalidShard` for what cannot work."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", prefix):
        raise InvalidShard(f"--prefix {prefix!r}: a Helm user deployment needs a Kubernetes "
                           "name (lower-case letters, digits, hyphens), e.g. oaipmh-dagster")
    template = _first_deployment(values)
    deployments = []
    for name in location_names(count, prefix):
        deployment = copy.deepcopy(template)
        deployment["name"] = name
        args = list(deployment["codeServerArgs"])
        if "--location-name" in args:
            args[args.index("--location-name") + 1] = name
        else:
            args += ["--location-name", name]
        deployment["codeServerArgs"] = args
        deployments.append(deployment)
    header = (f"# {count} user deployment(s) of oaipmh-dagster for Dagster's Helm chart, one "
              "per code location\n# (written by `oaipmh-dagster workspace --helm-values`): "
              "pass after the main values file.\n")
    body = {"dagster-user-deployments": {"enabled": True, "deployments": deployments}}
    return header + yaml.safe_dump(body, sort_keys=False, width=88)


def _first_deployment(values: str) -> dict[str, Any]:
    """The first user deployment of a Helm values file, checked for a code server."""
    try:
        data = yaml.safe_load(values)
    except yaml.YAMLError as exc:
        raise InvalidShard(f"the Helm values are not a YAML file: {exc}".splitlines()[0]) \
            from None
    users = data.get("dagster-user-deployments") if isinstance(data, dict) else None
    deployments = users.get("deployments") if isinstance(users, dict) else None
    if not deployments or not isinstance(deployments[0], dict):
        raise InvalidShard("the Helm values hold no user deployment to copy "
                           "(dagster-user-deployments.deployments)")
    first = deployments[0]
    args = first.get("codeServerArgs")
    if not isinstance(args, list) or "-m" not in args:
        raise InvalidShard("the first user deployment has no codeServerArgs with "
                           "`-m oaipmh_dagster.definitions`")
    return first
