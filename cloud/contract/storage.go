package contract

import (
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Where storage appears inside a worker container.
const (
	// HostPathPrefix is where node paths are mounted.
	HostPathPrefix = "/home/data"
	// DownloadPrefix is where the storage initializer puts downloaded files.
	DownloadPrefix = "/downloads"
	// StorageInitializerImage downloads s3:// and http(s):// URLs before the worker starts.
	StorageInitializerImage = "kubeedge/sedna-storage-initializer:v0.3.0"

	storageInitializerName = "storage-initializer"
	downloadVolumeName     = "sedna-storage-initializer"
)

// Annotations and keys of a credential Secret.
const (
	AnnotationS3Endpoint = "s3-endpoint"
	AnnotationS3UseHTTPS = "s3-usehttps"
)

// Storage is a model or data set URL that a worker reads, and the variable that tells the worker where it is.
type Storage struct {
	// EnvName receives the path inside the container.
	EnvName string
	// URL is a node path (no scheme), s3://, http:// or https:// (downloaded), or any other URL, which the
	// worker is handed as it is.
	URL string
	// IsDir marks a node path as a directory, mounted as it is; a file's parent directory is mounted instead.
	IsDir bool
	// Credential is the metadata of the Secret for an s3:// URL, or nil. Its keys are never read: pods refer to
	// them.
	Credential *metav1.PartialObjectMetadata
}

// MountStorage makes every item reachable from spec's containers — node paths as hostPath volumes under
// /home/data, s3:// and http(s):// URLs downloaded by an init container into /downloads, other URLs left to the
// worker — and returns the variables that point the worker at them.
func MountStorage(spec *corev1.PodSpec, items []Storage) (map[string]string, error) {
	env := map[string]string{}
	var downloadArgs []string
	var initEnv []corev1.EnvVar
	hostVolumes := map[string]bool{}
	for _, item := range items {
		u, err := url.Parse(item.URL)
		if err != nil {
			return nil, fmt.Errorf("parsing %s URL %q: %w", item.EnvName, item.URL, err)
		}
		switch u.Scheme {
		case "":
			hostDir, mountPath, containerPath := hostPaths(u.Path, item.IsDir)
			name := hostVolumeName(hostDir)
			if !hostVolumes[name] {
				hostVolumes[name] = true
				addHostPathVolume(spec, name, hostDir, mountPath)
			}
			env[item.EnvName] = containerPath
			env[EnvDataPathPrefix] = HostPathPrefix
		case "s3", "http", "https":
			containerPath := path.Join(DownloadPrefix, u.Host+u.Path)
			downloadArgs = append(downloadArgs, item.URL, path.Dir(containerPath))
			env[item.EnvName] = containerPath
			if u.Scheme == "s3" && item.Credential != nil {
				creds, err := CredentialEnv(item.Credential)
				if err != nil {
					return nil, err
				}
				initEnv = append(initEnv, creds...)
			}
		default:
			// Another scheme (hdfs://, obs://, ...) is the worker's to read, as with Sedna: handed over as it is,
			// with no mount, no download and no credential (those are for s3:// only).
			env[item.EnvName] = item.URL
		}
	}
	if len(downloadArgs) > 0 {
		addStorageInitializer(spec, downloadArgs, initEnv)
	}
	return env, nil
}

// CredentialEnv is the object-store endpoint and keys of a credential Secret, as Sedna workers expect them: the
// endpoint from the Secret's annotations, the keys as references into the Secret, so no key is ever copied into
// a pod spec, where everyone who may read pods (every edge agent) and every node's disk would hold it. A Secret
// without a key leaves the container unstarted (CreateContainerConfigError), which its pod's status tells.
func CredentialEnv(secret *metav1.PartialObjectMetadata) ([]corev1.EnvVar, error) {
	endpoint := secret.Annotations[AnnotationS3Endpoint]
	if endpoint == "" {
		return nil, fmt.Errorf("secret %s has no %q annotation", secret.Name, AnnotationS3Endpoint)
	}
	scheme := "https://"
	if secret.Annotations[AnnotationS3UseHTTPS] == "0" {
		scheme = "http://"
	}
	env := []corev1.EnvVar{{Name: EnvS3EndpointURL, Value: scheme + endpoint}}
	for _, key := range []string{EnvAccessKeyID, EnvSecretAccessKey} {
		env = append(env, corev1.EnvVar{Name: key, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secret.Name}, Key: key,
		}}})
	}
	return env, nil
}

// SecretMetadata is a Secret's metadata to read into. The controllers read credential Secrets only this way, so
// their cache holds no Secret's data: the endpoint is an annotation, and the keys reach the pods by reference.
func SecretMetadata() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	return m
}

func hostPaths(p string, isDir bool) (hostDir, mountPath, containerPath string) {
	containerPath = path.Join(HostPathPrefix, p)
	if isDir {
		return path.Clean(p), containerPath, containerPath
	}
	return path.Dir(path.Clean(p)), path.Dir(containerPath), containerPath
}

var notNameChar = regexp.MustCompile(`[^a-z0-9]+`)

// hostVolumeName derives a volume name from a node directory, so the same directory always mounts under the
// same name.
func hostVolumeName(dir string) string {
	name := "sedna-host" + strings.TrimRight(notNameChar.ReplaceAllString(strings.ToLower(dir), "-"), "-")
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	return name
}

func addHostPathVolume(spec *corev1.PodSpec, name, hostDir, mountPath string) {
	dirType := corev1.HostPathDirectory
	spec.Volumes = append(spec.Volumes, corev1.Volume{
		Name:         name,
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostDir, Type: &dirType}},
	})
	for i := range spec.Containers {
		spec.Containers[i].VolumeMounts = append(spec.Containers[i].VolumeMounts,
			corev1.VolumeMount{Name: name, MountPath: mountPath})
	}
}

func addStorageInitializer(spec *corev1.PodSpec, args []string, env []corev1.EnvVar) {
	spec.Volumes = append(spec.Volumes, corev1.Volume{
		Name: downloadVolumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
	})
	for i := range spec.Containers {
		spec.Containers[i].VolumeMounts = append(spec.Containers[i].VolumeMounts,
			corev1.VolumeMount{Name: downloadVolumeName, MountPath: DownloadPrefix, ReadOnly: true})
	}
	init := corev1.Container{
		Name:            storageInitializerName,
		Image:           StorageInitializerImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args:            args,
		VolumeMounts:    []corev1.VolumeMount{{Name: downloadVolumeName, MountPath: DownloadPrefix}},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("1"),
			corev1.ResourceMemory: resource.MustParse("1Gi"),
		}},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		Env:                      envList(nil, env),
	}
	spec.InitContainers = append(spec.InitContainers, init)
}
