// libcupti.so.13 for the host replay: the four calls the recorder makes, with the version node
// the recorder's references carry (fake_cupti.map). The callback it subscribes is kept for
// replay.c, which calls it as CUPTI would.
#include <cupti.h>
#include <stdlib.h>

#include "fake_abi.h"

static CUpti_CallbackFunc subscriber;
static void *subscriber_data;

CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *handle, CUpti_CallbackFunc callback,
                           void *userdata) {
    // FAKE_CUPTI_BUSY: a profiler holds the process, as CUPTI answers then
    if (subscriber || getenv("FAKE_CUPTI_BUSY"))
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    subscriber = callback;
    subscriber_data = userdata;
    *handle = (CUpti_SubscriberHandle)&subscriber;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle handle,
                              CUpti_CallbackDomain domain) {
    (void)enable, (void)handle, (void)domain;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetVersion(uint32_t *version) {
    *version = 130001;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetResultString(CUptiResult result, const char **text) {
    (void)result;
    *text = "CUPTI_ERROR_FAKE";
    return CUPTI_SUCCESS;
}

void *fake_cupti_subscriber(void **userdata) {
    *userdata = subscriber_data;
    return (void *)subscriber;
}
