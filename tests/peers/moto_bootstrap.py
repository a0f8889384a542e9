#!/usr/bin/env python3
"""Bootstraps a moto server that checks SigV4 (INITIAL_NO_AUTH_ACTION_COUNT=0).

Creates an admin user and a plugin user whose policy allows exactly the actions in
plugins/aws/README.md, then (as admin) a VPC, subnet, launch template and Auto Scaling group.
Prints JSON with both key pairs and the group name.

usage: moto_bootstrap.py ENDPOINT [MAX_SIZE]
       moto_bootstrap.py ENDPOINT --policy USER ACTIONS...   (replace the plugin user's policy)
       moto_bootstrap.py ENDPOINT --resize KEY SECRET GROUP MAX DESIRED   (change the group by hand)
       moto_bootstrap.py ENDPOINT --describe ADMIN_KEY ADMIN_SECRET GROUP
       moto_bootstrap.py ENDPOINT --instances ADMIN_KEY ADMIN_SECRET GROUP   (the group's instances)
       moto_bootstrap.py ENDPOINT --delete-group ADMIN_KEY ADMIN_SECRET GROUP   (force-delete it)
       moto_bootstrap.py ENDPOINT --create-group ADMIN_KEY ADMIN_SECRET GROUP MAX   (create it again)
       moto_bootstrap.py ENDPOINT --terminate ADMIN_KEY ADMIN_SECRET INSTANCE_ID   (terminate it in EC2)
       moto_bootstrap.py ENDPOINT --unhealthy ADMIN_KEY ADMIN_SECRET INSTANCE_ID   (Auto Scaling marks it Unhealthy)
       moto_bootstrap.py ENDPOINT --allow-unsigned N   (let the next N unsigned calls through)
       moto_bootstrap.py ENDPOINT --assume-role ROLE_ARN  (print temporary keys for the role)
"""
import json
import sys
import urllib.request

import boto3

PLUGIN_ACTIONS = [
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:SetDesiredCapacity",
    "autoscaling:TerminateInstanceInAutoScalingGroup",
    "ec2:DescribeInstances",
    "ec2-instance-connect:SendSSHPublicKey",
]


def client(endpoint, service, key=None, secret=None):
    kw = dict(endpoint_url=endpoint, region_name="us-east-1")
    if key:
        kw.update(aws_access_key_id=key, aws_secret_access_key=secret)
    else:
        kw.update(aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
    return boto3.client(service, **kw)


def policy(actions):
    return json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]})


def create_group(asg, name, max_size, subnet):
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": "ci-runner", "Version": "$Latest"},
        MinSize=0,
        MaxSize=max_size,
        DesiredCapacity=0,
        VPCZoneIdentifier=subnet,
        NewInstancesProtectedFromScaleIn=True,
    )
    asg.suspend_processes(AutoScalingGroupName=name, ScalingProcesses=["AZRebalance"])


def main():
    endpoint = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "--describe":
        key, secret, group = sys.argv[3:6]
        g = client(endpoint, "autoscaling", key, secret).describe_auto_scaling_groups(AutoScalingGroupNames=[group])
        print(json.dumps({"desired": g["AutoScalingGroups"][0]["DesiredCapacity"]}))
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--instances":
        key, secret, group = sys.argv[3:6]
        g = client(endpoint, "autoscaling", key, secret).describe_auto_scaling_groups(AutoScalingGroupNames=[group])
        found = g["AutoScalingGroups"][0]["Instances"] if g["AutoScalingGroups"] else []
        print(json.dumps([{"id": i["InstanceId"], "lifecycle": i["LifecycleState"]} for i in found]))
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--delete-group":
        key, secret, group = sys.argv[3:6]
        client(endpoint, "autoscaling", key, secret).delete_auto_scaling_group(AutoScalingGroupName=group, ForceDelete=True)
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--unhealthy":
        key, secret, instance = sys.argv[3:6]
        client(endpoint, "autoscaling", key, secret).set_instance_health(InstanceId=instance, HealthStatus="Unhealthy")
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--terminate":
        key, secret, instance = sys.argv[3:6]
        client(endpoint, "ec2", key, secret).terminate_instances(InstanceIds=[instance])
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--create-group":
        key, secret, group, max_size = sys.argv[3:7]
        subnets = client(endpoint, "ec2", key, secret).describe_subnets(Filters=[{"Name": "cidr-block", "Values": ["10.20.1.0/24"]}])
        create_group(client(endpoint, "autoscaling", key, secret), group, int(max_size), subnets["Subnets"][0]["SubnetId"])
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--resize":
        # An operator changing the group by hand: --resize KEY SECRET GROUP MAX DESIRED
        key, secret, group, max_size, desired = sys.argv[3:8]
        client(endpoint, "autoscaling", key, secret).update_auto_scaling_group(
            AutoScalingGroupName=group, MaxSize=int(max_size), DesiredCapacity=int(desired))
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--allow-unsigned":
        # moto's auth check crashes on unsigned calls; STS AssumeRoleWithWebIdentity is unsigned.
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=sys.argv[3].encode(), method="POST", headers={"Content-Type": "text/plain"}))
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--assume-role":
        # Temporary keys for the role, to serve from a canned instance metadata service.
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"1", method="POST", headers={"Content-Type": "text/plain"}))
        c = client(endpoint, "sts").assume_role_with_web_identity(RoleArn=sys.argv[3], RoleSessionName="imds", WebIdentityToken="token")["Credentials"]
        print(json.dumps({"key": c["AccessKeyId"], "secret": c["SecretAccessKey"], "token": c["SessionToken"]}))
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--policy-as":
        # The admin's own keys, so the change needs no unauthenticated window that concurrent
        # traffic could use up: --policy-as KEY SECRET USER ACTIONS...
        key, secret, user, actions = sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
        client(endpoint, "iam", key, secret).put_user_policy(UserName=user, PolicyName="flotilla", PolicyDocument=policy(actions))
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--policy":
        user, actions = sys.argv[3], sys.argv[4:]
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"1", method="POST", headers={"Content-Type": "text/plain"}))
        client(endpoint, "iam").put_user_policy(UserName=user, PolicyName="flotilla", PolicyDocument=policy(actions))
        return
    max_size = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"8", method="POST", headers={"Content-Type": "text/plain"}))
    iam = client(endpoint, "iam")
    users = {}
    for name, actions in (("admin", ["*"]), ("plugin", PLUGIN_ACTIONS)):
        iam.create_user(UserName=name)
        k = iam.create_access_key(UserName=name)["AccessKey"]
        iam.put_user_policy(UserName=name, PolicyName="flotilla", PolicyDocument=policy(actions))
        users[name] = {"key": k["AccessKeyId"], "secret": k["SecretAccessKey"]}
    trust = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Federated": "arn:aws:iam::123456789012:oidc-provider/oidc.example"}, "Action": "sts:AssumeRoleWithWebIdentity"}]})
    role = iam.create_role(RoleName="ci-scaler", AssumeRolePolicyDocument=trust)["Role"]["Arn"]
    iam.put_role_policy(RoleName="ci-scaler", PolicyName="flotilla", PolicyDocument=policy(PLUGIN_ACTIONS))
    admin = users["admin"]
    ec2 = client(endpoint, "ec2", admin["key"], admin["secret"])
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    ec2.create_launch_template(
        LaunchTemplateName="ci-runner",
        LaunchTemplateData={"ImageId": "ami-760aaa0f", "InstanceType": "t3.micro"},
    )
    create_group(client(endpoint, "autoscaling", admin["key"], admin["secret"]), "ci-runners", max_size, subnet)
    print(json.dumps({"users": users, "group": "ci-runners", "role": role}))


if __name__ == "__main__":
    main()
