import factory
from django.contrib.auth import get_user_model

from runs.models import Membership, Tenant


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"Tenant {n}")
    slug = factory.Sequence(lambda n: f"tenant-{n}")
    max_running = 50


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", "secret-pass")

    @factory.post_generation
    def save_password(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = Membership.Role.OPERATOR


def make_lead(tenant, **fields):
    """A lead of the tenant in the CRM demo app: Kim Lee of Acme at the proposal stage, unless told otherwise."""
    from examples.crm.models import Lead

    return Lead.objects.create(
        tenant=tenant,
        **(
            {"name": "Kim Lee", "company": "Acme", "email": "kim@acme.test", "stage": "proposal"}
            | fields
        ),
    )
