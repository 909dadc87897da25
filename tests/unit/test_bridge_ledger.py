"""The scheduler's job <-> pods bookkeeping (`bridge.scheduler.ledger`): one job for many
pods, a pod waiting on one job at a time, uncertain submissions, owed cancels."""

from __future__ import annotations

import pytest

from slinky.bridge.scheduler.ledger import Ledger


def test_a_group_job_is_remembered_for_each_pod_until_its_label() -> None:
    ledger = Ledger()
    ledger.made(7, [("ns/g-0", "u0"), ("ns/g-1", "u1")])
    assert ledger.job_made_for("u0") == 7 and ledger.job_made_for("u1") == 7
    assert ledger.unlabelled("ns/g-1") == ("u1", 7)
    assert ledger.labelled("ns/g-0", "u0") == ("u0", 7)
    assert ledger.job_made_for("u0") is None and ledger.unlabelled("ns/g-0") is None
    assert ledger.job_made_for("u1") == 7  # the other member still waits for its label


def test_a_pod_made_anew_under_the_same_name_does_not_keep_the_old_uid() -> None:
    ledger = Ledger()
    ledger.made(3, [("ns/p", "old")])
    assert ledger.labelled("ns/p", "new") == ("old", 3)
    assert ledger.job_made_for("old") is None


def test_a_pod_gone_without_uid_still_forgets_by_key() -> None:
    ledger = Ledger()
    ledger.made(3, [("ns/p", "u")])
    assert ledger.labelled("ns/p", "") == ("u", 3)
    assert ledger.job_made_for("u") is None


def test_many_pods_wait_on_one_job_and_the_last_one_ends_the_watch() -> None:
    ledger = Ledger()
    ledger.wait("ns/g-0", 9)
    ledger.wait("ns/g-1", 9)
    assert ledger.waiters(9) == ["ns/g-0", "ns/g-1"]
    assert ledger.waiting_count() == 2 and ledger.waited_jobs() == [9]
    assert ledger.stop_waiting("ns/g-0") is None  # g-1 still waits on job 9
    assert ledger.waiters(9) == ["ns/g-1"]
    assert ledger.stop_waiting("ns/g-1") == 9
    assert ledger.waiters(9) == [] and ledger.waited_jobs() == []
    assert ledger.stop_waiting("ns/g-1") is None  # twice is harmless


def test_a_pod_waits_on_one_job_at_a_time() -> None:
    """A replaced job: the pod moves to the new one and the old one has no waiter left."""
    ledger = Ledger()
    ledger.wait("ns/p", 1)
    ledger.wait("ns/p", 2)
    assert ledger.waits_on("ns/p") == 2
    assert ledger.waiters(1) == [] and ledger.waited_jobs() == [2]
    ledger.wait("ns/p", 2)
    assert ledger.waiting_pods() == ["ns/p"]


def test_uncertain_submissions_are_settled_only_for_the_pod_asked_about() -> None:
    ledger = Ledger()
    ledger.unsure("ns/a", "ua")
    ledger.unsure("ns/b", "ub")
    assert ledger.uncertain(["ns/a", "ns/c"]) == {"ns/a": "ua"}
    asked = ledger.uncertain()
    ledger.unsure("ns/a", "ua2")  # made anew while Slurm was asked about the old pod
    ledger.settled(asked)
    assert ledger.uncertain() == {"ns/a": "ua2"}
    assert ledger.is_uncertain("ns/a") and not ledger.is_uncertain("ns/b")
    assert ledger.uncertain_uid("ns/a") == "ua2"


def test_replacements() -> None:
    ledger = Ledger()
    ledger.replacing("u", 5)
    assert ledger.replacement("u") == 5
    ledger.replaced("u")
    assert ledger.replacement("u") is None


def test_owed_cancels_and_confirming() -> None:
    ledger = Ledger()
    ledger.owe_cancel(12, {"ns/a": "u1"})
    ledger.owe_cancel(4, {"ns/b": "u2"})
    ledger.owe_cancel(12, {"ns/a": "u1"})
    assert ledger.owed() == [(4, {"ns/b": "u2"}), (12, {"ns/a": "u1"})]
    ledger.paid(4)
    assert ledger.owed() == [(12, {"ns/a": "u1"})]
    with ledger.confirming(8):
        assert ledger.is_confirming(8)
    assert not ledger.is_confirming(8)
    with pytest.raises(RuntimeError), ledger.confirming(8):
        raise RuntimeError
    assert not ledger.is_confirming(8)


def test_dropping_a_job_frees_every_pod_that_waited_on_it() -> None:
    ledger = Ledger()
    ledger.wait("ns/g-0", 9)
    ledger.wait("ns/g-1", 9)
    ledger.wait("ns/p", 3)
    assert ledger.drop_job(9) == ["ns/g-0", "ns/g-1"]
    assert ledger.waited_jobs() == [3] and ledger.waits_on("ns/g-1") is None
    assert ledger.drop_job(9) == []


def test_a_submitted_job_counts_in_its_partition_until_a_pod_waits_on_it() -> None:
    ledger = Ledger()
    ledger.submitted(7, "bridge")
    assert ledger.submitted_unwaited("bridge") and not ledger.submitted_unwaited("other")
    ledger.wait("ns/p", 7)
    assert not ledger.submitted_unwaited("bridge")
