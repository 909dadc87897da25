"""The test bed's directory: entries slapd loads, and the chart values that read it."""

from __future__ import annotations

from slinky_testbed import ldap


def test_users_get_a_posix_account_and_a_group_of_their_own_and_join_extra_groups() -> None:
    directory = ldap.Directory(
        users=(ldap.User("dana", 5001, groups=("ldapusers",)), ldap.User("erin", 5002)),
        groups={"ldapusers": 6000},
    )
    entries = {e.split("\n", 1)[0]: e for e in ldap.ldif(directory).split("\n\n")}
    dana = entries[f"dn: uid=dana,ou=people,{ldap.BASE_DN}"]
    assert "objectClass: posixAccount" in dana
    assert "uidNumber: 5001\ngidNumber: 5001\n" in dana
    assert "homeDirectory: /home/dana" in dana
    assert "gidNumber: 5002" in entries[f"dn: cn=erin,ou=groups,{ldap.BASE_DN}"]
    group = entries[f"dn: cn=ldapusers,ou=groups,{ldap.BASE_DN}"]
    assert "memberUid: dana" in group and "memberUid: erin" not in group


def test_the_pod_reads_its_password_from_the_secret_and_the_chart_binds_with_it() -> None:
    objs = ldap.manifests("site", "img:1", ldap.Directory(users=()), "pw")
    kinds = {o["kind"]: o for o in objs}
    assert kinds["Secret"]["stringData"] == {"password": "pw"}
    env = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"][0]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "ldap", "key": "password"}
    values = ldap.sssd_values("site")
    assert values["uri"] == "ldap://ldap.site.svc.cluster.local"
    assert values["bindPasswordSecretRef"] == {"name": "ldap", "key": "password"}
    assert "@ROOTPW@" in ldap.SLAPD_CONF
