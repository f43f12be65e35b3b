"""Where a node sits, from its Kubernetes Node's labels (core/topology_labels.py), and the
precedence of the three sources, without a server.

Aspects covered:
- the default keys: the rack label for the rack; NVIDIA GPU feature discovery's NVLink
  clique, else Topograph's accelerator domain, for the NVLink domain (a level of its own:
  a clique is no rack); Topograph's tiers (then its older leaf and spine);
  a level's first key the Node carries wins, an empty value says nothing, a Node that
  names no level is left out;
- keys named in the policy replace the defaults; a key that is no Kubernetes label key is
  refused with its field named;
- precedence per node and level (the NVLink domain too): the policy, then the labels, then
  topology.conf; a level no source names stays unknown.
"""

from __future__ import annotations

import pytest

from autoclusters.core.policy import (
    GPU_CLIQUE_LABEL,
    RACK_LABEL,
    TOPOGRAPH_DOMAIN_LABEL,
    TOPOGRAPH_LEAF_LABELS,
    TOPOGRAPH_POD_LABELS,
    NodeTopology,
    PolicyError,
    TopologyLabels,
    default_policy,
    parse_policy,
)
from autoclusters.core.topology_labels import merged_topology, topology_from_labels

CLIQUE = "5f2c9a4e-5b1d-4c3e-9f0a-2d7e8b6c1a00.1"


def test_the_default_keys_read_the_rack_and_the_nvlink_clique_apart() -> None:
    labels = {
        "gpu-01": {RACK_LABEL: "rack-07", GPU_CLIQUE_LABEL: CLIQUE, "other": "x"},
        "gpu-02": {GPU_CLIQUE_LABEL: CLIQUE},  # no rack label: no rack, its NVLink domain
        "gpu-03": {RACK_LABEL: "", GPU_CLIQUE_LABEL: CLIQUE},  # an empty value says nothing
        # Topograph: 1.x's tiers before the older leaf and spine labels.
        "gpu-04": {TOPOGRAPH_LEAF_LABELS[1]: "old", TOPOGRAPH_LEAF_LABELS[0]: "leaf-3",
                   TOPOGRAPH_POD_LABELS[1]: "spine-1"},
        "gpu-05": {"kubernetes.io/hostname": "gpu-05"},  # names no level: left out
        "gpu-06": {TOPOGRAPH_DOMAIN_LABEL: "nvl-2"},
        "gpu-07": {GPU_CLIQUE_LABEL: CLIQUE, TOPOGRAPH_DOMAIN_LABEL: "nvl-2"},  # the clique first
    }  # fmt: skip
    topo = topology_from_labels(labels, TopologyLabels())
    assert topo == {
        "gpu-01": NodeTopology(nvlink=CLIQUE, rack="rack-07"),
        "gpu-02": NodeTopology(nvlink=CLIQUE),
        "gpu-03": NodeTopology(nvlink=CLIQUE),
        "gpu-04": NodeTopology(leaf="leaf-3", pod="spine-1"),
        "gpu-06": NodeTopology(nvlink="nvl-2"),
        "gpu-07": NodeTopology(nvlink=CLIQUE),
    }
    assert default_policy().topology_labels == TopologyLabels()  # the shipped policy's


def test_keys_the_policy_names_replace_the_defaults() -> None:
    policy = parse_policy(
        "topology_labels: {rack: [example.com/rack], leaf: [example.com/ib-leaf], pod: [],"
        " nvlink: [example.com/nvl]}"
    )
    labels = {
        "gpu-01": {"example.com/rack": "r1", RACK_LABEL: "ignored", "example.com/ib-leaf": "l1",
                   GPU_CLIQUE_LABEL: "ignored", "example.com/nvl": "n1"},
        "gpu-02": {RACK_LABEL: "ignored", TOPOGRAPH_POD_LABELS[0]: "ignored",
                   GPU_CLIQUE_LABEL: "ignored"},
    }  # fmt: skip
    assert topology_from_labels(labels, policy.topology_labels) == {
        "gpu-01": NodeTopology(leaf="l1", nvlink="n1", rack="r1")
    }


@pytest.mark.parametrize("level", ["rack", "nvlink"])
@pytest.mark.parametrize("key", ["rack label", "-rack", "Example.com/rack", "a/b/c", "x" * 64])
def test_a_key_that_is_no_label_key_is_refused_by_its_field(key: str, level: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(f"topology_labels: {{{level}: ['{key}']}}")
    assert f"topology_labels.{level}" in str(e.value)


def test_the_policy_then_the_labels_then_topology_conf_level_by_level() -> None:
    policy = {"gpu-01": NodeTopology(rack="rack-from-policy", nvlink="nvl-from-policy")}
    labels = {
        "gpu-01": NodeTopology(rack="rack-from-labels", leaf="leaf-from-labels", nvlink="nvl-x"),
        "gpu-03": NodeTopology(nvlink="nvl-03"),
        "gpu-02": NodeTopology(rack="rack-02"),
    }
    conf = {
        "gpu-01": NodeTopology(leaf="leaf-from-conf", pod="pod-01"),
        "gpu-02": NodeTopology(leaf="leaf-01", pod="pod-01"),
        "gpu-03": NodeTopology(leaf="leaf-01"),
    }
    assert merged_topology(policy=policy, labels=labels, conf=conf) == {
        "gpu-01": NodeTopology(
            rack="rack-from-policy", nvlink="nvl-from-policy", leaf="leaf-from-labels", pod="pod-01"
        ),
        "gpu-02": NodeTopology(leaf="leaf-01", pod="pod-01", rack="rack-02"),
        # no rack anywhere: unknown, no rack member; its NVLink domain from the labels
        "gpu-03": NodeTopology(leaf="leaf-01", nvlink="nvl-03"),
    }
    assert merged_topology(policy={}, labels={}, conf={}) == {}
