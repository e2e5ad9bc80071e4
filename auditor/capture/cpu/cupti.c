/* libcupti for `egf-audit capture --cpu`: CUPTI's callback API, driven by the fake libcuda.
 *
 * The recorder (egf_capture_recorder.c, unchanged) subscribes, enables the driver and runtime
 * domains, and is called back for every API call of the fakes with CUPTI's CUpti_CallbackData.
 * Only the callback API is here; the activity, event, metric and profiling APIs are not.
 */
#include <stdint.h>
#include <string.h>

#include "egf_cpu.h"

#define CPU_CUPTI_VERSION 130001  // the CUPTI version whose callback API this models (CUDA 13)

struct CUpti_Subscriber_st {
    int unused;
};
static struct CUpti_Subscriber_st the_subscriber;

CUptiResult CUPTIAPI cuptiGetVersion(uint32_t *version) {
    if (!version) return CUPTI_ERROR_INVALID_PARAMETER;
    *version = CPU_CUPTI_VERSION;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback,
                                    void *userdata) {
    if (!subscriber || !callback) return CUPTI_ERROR_INVALID_PARAMETER;
    if (!egf_cpu_subscribe(callback, userdata)) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    *subscriber = &the_subscriber;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiUnsubscribe(CUpti_SubscriberHandle subscriber) {
    if (subscriber != &the_subscriber) return CUPTI_ERROR_INVALID_PARAMETER;
    egf_cpu_unsubscribe();
    return CUPTI_SUCCESS;
}

static int known_domain(CUpti_CallbackDomain domain) {
    return domain == CUPTI_CB_DOMAIN_DRIVER_API || domain == CUPTI_CB_DOMAIN_RUNTIME_API;
}

CUptiResult CUPTIAPI cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                       CUpti_CallbackDomain domain) {
    if (subscriber != &the_subscriber) return CUPTI_ERROR_INVALID_PARAMETER;
    if (!known_domain(domain)) return CUPTI_ERROR_NOT_SUPPORTED;  // resource, sync, nvtx, ...
    egf_cpu_enable(domain, -1, (int)enable);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                         CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
    if (subscriber != &the_subscriber) return CUPTI_ERROR_INVALID_PARAMETER;
    if (!known_domain(domain)) return CUPTI_ERROR_NOT_SUPPORTED;
    egf_cpu_enable(domain, (int)cbid, (int)enable);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiEnableAllDomains(uint32_t enable, CUpti_SubscriberHandle subscriber) {
    if (subscriber != &the_subscriber) return CUPTI_ERROR_INVALID_PARAMETER;
    egf_cpu_enable(CUPTI_CB_DOMAIN_DRIVER_API, -1, (int)enable);
    egf_cpu_enable(CUPTI_CB_DOMAIN_RUNTIME_API, -1, (int)enable);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetCallbackState(uint32_t *enable, CUpti_SubscriberHandle subscriber,
                                           CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
    if (!enable || subscriber != &the_subscriber) return CUPTI_ERROR_INVALID_PARAMETER;
    *enable = (uint32_t)egf_cpu_enabled(domain, (int)cbid);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char **str) {
    if (!str) return CUPTI_ERROR_INVALID_PARAMETER;
    switch (result) {
        case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
        case CUPTI_ERROR_INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
        case CUPTI_ERROR_NOT_SUPPORTED: *str = "CUPTI_ERROR_NOT_SUPPORTED"; break;
        case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
            *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
            break;
        default: *str = "CUPTI_ERROR_UNKNOWN"; break;
    }
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetErrorMessage(CUptiResult result, const char **str) {
    return cuptiGetResultString(result, str);
}

CUptiResult CUPTIAPI cuptiSupportedDomains(size_t *domainCount, CUpti_DomainTable *domainTable) {
    static CUpti_CallbackDomain domains[] = {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_CB_DOMAIN_RUNTIME_API};
    if (!domainCount || !domainTable) return CUPTI_ERROR_INVALID_PARAMETER;
    *domainCount = 2;
    *domainTable = domains;
    return CUPTI_SUCCESS;
}
