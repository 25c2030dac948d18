"""/api/v1/ routes of the scheduler: jobs, nodes, devices, flavors."""

from rest_framework.routers import SimpleRouter

from scheduler.api import views

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("devices", views.DeviceViewSet, basename="device")
router.register("flavors", views.FlavorViewSet, basename="flavor")

urlpatterns = router.urls
