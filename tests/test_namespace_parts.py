"""The namespace is composed, not mixed: static checks of ``meta/namespace/``.

Why: ``Namespace`` builds its parts (``NamespaceView``, ``Allocators``, ``QuotaPlanner``,
``ReclaimPlanner``, ``NamespacePlanner``, ``RenamePlanner``, ``ConcatPlanner``,
``RecordApplier``), each given what it uses in its constructor; they call each other
through public methods. A class inheriting two project classes (a mixin host) shares state
through ``self`` again, and ``other._private`` reaches into a part's state past its
methods; both fail here (the checks themselves are tested in ``test_mount_parts``).
"""

from __future__ import annotations

from pathlib import Path

from test_mount_parts import mixin_hosts, package_modules, private_reaches

NAMESPACE = Path(__file__).resolve().parent.parent / "meta" / "namespace"


def test_no_namespace_class_subclasses_more_than_one_project_class():
    hosts = mixin_hosts(package_modules(NAMESPACE, "namespace.py"), "meta/namespace")
    assert not hosts, "mixin hosts (compose parts instead): " + "; ".join(hosts)


def test_namespace_parts_reach_no_private_state_of_another_object():
    reaches = private_reaches(package_modules(NAMESPACE, "namespace.py"), "meta/namespace")
    assert not reaches, "private state reached past its owner: " + "; ".join(reaches)
