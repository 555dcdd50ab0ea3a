package contract

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func credential(annotations map[string]string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "s3-cred", Annotations: annotations}}
}

// keyRef is a variable read from a key of the s3-cred Secret.
func keyRef(key string) corev1.EnvVar {
	return corev1.EnvVar{Name: key, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "s3-cred"}, Key: key}}}
}

func TestMountStorage(t *testing.T) {
	dirType := corev1.HostPathDirectory
	cases := []struct {
		name        string
		items       []Storage
		wantEnv     map[string]string
		wantVolumes []corev1.Volume
		wantMounts  []corev1.VolumeMount
		wantInit    []corev1.EnvVar // env of the storage initializer; nil: no initializer
		wantArgs    []string
		wantErr     string
	}{{
		name:    "node file mounts its parent directory",
		items:   []Storage{{EnvName: EnvModelURL, URL: "/model/frozen.pb"}},
		wantEnv: map[string]string{EnvModelURL: "/home/data/model/frozen.pb", EnvDataPathPrefix: HostPathPrefix},
		wantVolumes: []corev1.Volume{{Name: "sedna-host-model", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/model", Type: &dirType}}}},
		wantMounts: []corev1.VolumeMount{{Name: "sedna-host-model", MountPath: "/home/data/model"}},
	}, {
		name:    "node directory mounts itself",
		items:   []Storage{{EnvName: EnvTrainDatasetURL, URL: "/data/set1/", IsDir: true}},
		wantEnv: map[string]string{EnvTrainDatasetURL: "/home/data/data/set1", EnvDataPathPrefix: HostPathPrefix},
		wantVolumes: []corev1.Volume{{Name: "sedna-host-data-set1", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/data/set1", Type: &dirType}}}},
		wantMounts: []corev1.VolumeMount{{Name: "sedna-host-data-set1", MountPath: "/home/data/data/set1"}},
	}, {
		name: "two files of one directory share a volume",
		items: []Storage{
			{EnvName: EnvModelURL, URL: "/models/a.pb"},
			{EnvName: EnvPretrainedModelURL, URL: "/models/b.pb"},
		},
		wantEnv: map[string]string{EnvModelURL: "/home/data/models/a.pb", EnvPretrainedModelURL: "/home/data/models/b.pb",
			EnvDataPathPrefix: HostPathPrefix},
		wantVolumes: []corev1.Volume{{Name: "sedna-host-models", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/models", Type: &dirType}}}},
		wantMounts: []corev1.VolumeMount{{Name: "sedna-host-models", MountPath: "/home/data/models"}},
	}, {
		name:    "s3 with a credential is downloaded with the keys",
		items:   []Storage{{EnvName: EnvModelURL, URL: "s3://bucket/models/m.pb", Credential: credential(map[string]string{AnnotationS3Endpoint: "minio:9000"})}},
		wantEnv: map[string]string{EnvModelURL: "/downloads/bucket/models/m.pb"},
		wantVolumes: []corev1.Volume{{Name: "sedna-storage-initializer", VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		wantMounts: []corev1.VolumeMount{{Name: "sedna-storage-initializer", MountPath: DownloadPrefix, ReadOnly: true}},
		wantArgs:   []string{"s3://bucket/models/m.pb", "/downloads/bucket/models"},
		wantInit: []corev1.EnvVar{keyRef(EnvAccessKeyID), {Name: EnvS3EndpointURL, Value: "https://minio:9000"},
			keyRef(EnvSecretAccessKey)},
	}, {
		name:    "plain-http object store",
		items:   []Storage{{EnvName: EnvModelURL, URL: "s3://b/m", Credential: credential(map[string]string{AnnotationS3Endpoint: "minio:9000", AnnotationS3UseHTTPS: "0"})}},
		wantEnv: map[string]string{EnvModelURL: "/downloads/b/m"},
		wantVolumes: []corev1.Volume{{Name: "sedna-storage-initializer", VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		wantMounts: []corev1.VolumeMount{{Name: "sedna-storage-initializer", MountPath: DownloadPrefix, ReadOnly: true}},
		wantArgs:   []string{"s3://b/m", "/downloads/b"},
		wantInit: []corev1.EnvVar{keyRef(EnvAccessKeyID), {Name: EnvS3EndpointURL, Value: "http://minio:9000"},
			keyRef(EnvSecretAccessKey)},
	}, {
		name:    "https without a credential",
		items:   []Storage{{EnvName: EnvModelURL, URL: "https://example.com/m/model.onnx"}},
		wantEnv: map[string]string{EnvModelURL: "/downloads/example.com/m/model.onnx"},
		wantVolumes: []corev1.Volume{{Name: "sedna-storage-initializer", VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		wantMounts: []corev1.VolumeMount{{Name: "sedna-storage-initializer", MountPath: DownloadPrefix, ReadOnly: true}},
		wantArgs:   []string{"https://example.com/m/model.onnx", "/downloads/example.com/m"},
		wantInit:   []corev1.EnvVar{},
	}, {
		name: "other schemes pass through, with no mount, download or credential",
		items: []Storage{{EnvName: EnvModelURL, URL: "hdfs://namenode:8020/m/model.pb", Credential: credential(nil)},
			{EnvName: EnvTrainDatasetURL, URL: "obs://bucket/d/train.txt"}},
		wantEnv: map[string]string{EnvModelURL: "hdfs://namenode:8020/m/model.pb", EnvTrainDatasetURL: "obs://bucket/d/train.txt"},
	}, {
		name:    "not a URL",
		items:   []Storage{{EnvName: EnvModelURL, URL: "s3://b/%zz"}},
		wantErr: `parsing MODEL_URL URL "s3://b/%zz"`,
	}, {
		name:    "credential without endpoint",
		items:   []Storage{{EnvName: EnvModelURL, URL: "s3://b/m", Credential: credential(nil)}},
		wantErr: `secret s3-cred has no "s3-endpoint" annotation`,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := &corev1.PodSpec{Containers: []corev1.Container{{Name: "worker"}}}
			env, err := MountStorage(spec, tc.items)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantEnv, env); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantVolumes, spec.Volumes); diff != "" {
				t.Errorf("volumes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantMounts, spec.Containers[0].VolumeMounts); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			if tc.wantInit == nil {
				if len(spec.InitContainers) != 0 {
					t.Errorf("unexpected init containers %v", spec.InitContainers)
				}
				return
			}
			if len(spec.InitContainers) != 1 {
				t.Fatalf("init containers = %d, want the storage initializer", len(spec.InitContainers))
			}
			init := spec.InitContainers[0]
			if init.Image != StorageInitializerImage {
				t.Errorf("initializer image = %s", init.Image)
			}
			if diff := cmp.Diff(tc.wantArgs, init.Args); diff != "" {
				t.Errorf("initializer args (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantInit, init.Env); diff != "" {
				t.Errorf("initializer env (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSetEnvReplacesContractNamesAndKeepsUserOrder(t *testing.T) {
	spec := &corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Env: []corev1.EnvVar{
		{Name: "input_shape", Value: "416,736"}, {Name: EnvWorkerName, Value: "mine"}, {Name: "video_url", Value: "rtsp://x"},
	}}}}
	SetEnv(spec, map[string]string{EnvWorkerName: "ji-deployment-edge", EnvNamespace: "default", EnvAccessKeyID: "literal"},
		keyRef(EnvAccessKeyID))
	want := []corev1.EnvVar{
		{Name: "input_shape", Value: "416,736"}, {Name: "video_url", Value: "rtsp://x"},
		keyRef(EnvAccessKeyID), {Name: EnvNamespace, Value: "default"}, {Name: EnvWorkerName, Value: "ji-deployment-edge"},
	}
	if diff := cmp.Diff(want, spec.Containers[0].Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
}

func TestTolerateDisconnection(t *testing.T) {
	userSeconds := int64(60)
	cases := []struct {
		name string
		in   []corev1.Toleration
		want []corev1.Toleration
	}{{
		name: "adds both taints without a time limit",
		want: []corev1.Toleration{
			{Key: TaintUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
			{Key: TaintNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		},
	}, {
		name: "keeps the user's own",
		in:   []corev1.Toleration{{Key: TaintUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &userSeconds}},
		want: []corev1.Toleration{
			{Key: TaintUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &userSeconds},
			{Key: TaintNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := &corev1.PodSpec{Tolerations: tc.in}
			TolerateDisconnection(spec)
			TolerateDisconnection(spec) // idempotent
			if diff := cmp.Diff(tc.want, spec.Tolerations); diff != "" {
				t.Errorf("tolerations (-want +got):\n%s", diff)
			}
		})
	}
}
