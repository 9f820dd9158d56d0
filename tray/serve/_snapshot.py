"""What the controller's checkpoint holds, and the state a restarted
controller rebuilds from it (``_checkpoint`` writes and reads the keys).

The snapshot is plain data: the HTTP settings, the counter of replicas made,
each application (route prefix, ingress, deployments), each deployment
(the key of its spec, its config version and target, its replicas' ids,
versions, and whether they were stopping), and the nodes with a proxy.
A restarted controller (tray restarts it: ``max_restarts=-1``) rebuilds
its state from it with every replica ``RECOVERING``, then looks each replica
and proxy up by name and re-attaches the live ones (the managers'
``reattach``), forgetting the dead ones."""

from __future__ import annotations

import logging

from ._application_state import ApplicationState, ApplicationStateManager
from ._checkpoint import spec_key
from ._deployment_state import DeploymentReplica, DeploymentState, DeploymentStateManager
from ._proxy_state import ProxyState, ProxyStateManager
from ._status import ReplicaState

logger = logging.getLogger("tray.serve")


def snapshot(application_states: ApplicationStateManager,
             deployment_states: DeploymentStateManager,
             proxy_states: ProxyStateManager) -> dict:
    return {
        "http_options": proxy_states.http_options,
        "proxy_location": proxy_states.proxy_location,
        "head_node_id": proxy_states.head_node_id, "counter": deployment_states.counter,
        "apps": {name: {"route_prefix": app.route_prefix, "ingress": app.ingress,
                        "deployments": list(app.deployments),
                        "deployed_at_s": app.deployed_at_s, "deleting": app.deleting,
                        "was_running": app.was_running}
                 for name, app in application_states.apps.items()},
        "deployments": [
            {"app": dep.app_name, "name": dep.name, "spec_key": spec_key(dep.spec),
             "config_version": dep.config_version, "target_num": dep.target_num,
             "deleting": dep.deleting, "failures": dep.constructor_failures,
             "message": dep.message,
             "replicas": [(r.replica_id, r.version, r.config_version,
                           r.state == ReplicaState.STOPPING) for r in dep.replicas]}
            for dep in deployment_states.deployments.values()],
        "proxies": list(proxy_states.proxies),
    }


def restore(snapshot: dict, items: dict, application_states: ApplicationStateManager,
            deployment_states: DeploymentStateManager,
            proxy_states: ProxyStateManager) -> list:
    """Rebuild the managers' state (empty) from ``snapshot`` and the
    checkpoint's ``items`` (its specs); the replicas to re-attach, as
    ``(deployment, replica, whether it was stopping)``."""
    import cloudpickle

    apps = application_states.apps
    deployments = deployment_states.deployments
    proxy_states.http_options = snapshot["http_options"]
    proxy_states.proxy_location = snapshot["proxy_location"]
    proxy_states.head_node_id = snapshot["head_node_id"]
    deployment_states.counter = snapshot["counter"]
    for name, app in snapshot["apps"].items():
        apps[name] = ApplicationState(
            name=name, route_prefix=app["route_prefix"], ingress=app["ingress"],
            deployments=list(app["deployments"]), deployed_at_s=app["deployed_at_s"],
            deleting=app["deleting"], was_running=app["was_running"])
    lookups = []
    for record in snapshot["deployments"]:
        spec_blob = items.get(record["spec_key"])
        if spec_blob is None:
            logger.error("serve controller: the checkpoint lacks the spec of %s/%s",
                         record["app"], record["name"])
            continue
        dep = DeploymentState(app_name=record["app"], name=record["name"],
                              spec=cloudpickle.loads(spec_blob),
                              config_version=record["config_version"],
                              target_num=record["target_num"], deleting=record["deleting"],
                              constructor_failures=record["failures"],
                              message=record["message"])
        deployments[(dep.app_name, dep.name)] = dep
        for replica_id, version, config_version, stopping in record["replicas"]:
            replica = DeploymentReplica(replica_id=replica_id, version=version,
                                        config_version=config_version,
                                        state=ReplicaState.RECOVERING)
            dep.replicas.append(replica)
            lookups.append((dep, replica, stopping))
    for app in list(apps.values()):
        lost = [n for n in app.deployments if (app.name, n) not in deployments]
        if lost:
            # A state never names a spec the GCS lacks (specs are written
            # before it and deleted after it): only keys deleted from
            # outside get here. The application is lost, as with no
            # checkpoint (serve.run sends it again; its replicas, unknown
            # now, stop themselves).
            logger.error("serve controller: application %r lost deployment(s) %s with "
                         "the checkpoint", app.name, lost)
            for name in app.deployments:
                dep = deployments.pop((app.name, name), None)
                if dep is not None:
                    lookups = [item for item in lookups if item[0] is not dep]
            del apps[app.name]
    for node_id in snapshot["proxies"]:
        proxy_states.proxies[node_id] = ProxyState(node_id=node_id)
    return lookups
